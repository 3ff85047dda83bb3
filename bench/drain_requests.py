"""API requests of one `dra-guard drain NODE --evict-drivers`, counted in the apiserver's audit log.

On one real control plane (tests/e2e/cluster.py: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, audit log at level Metadata; no kubelet) each drain gets a fresh fake Node with a
ResourceSlice, a DRA driver DaemonSet declared in dra-guard's config (placed there by the real
DaemonSet controller) and `node_pods` consumers, each with a ResourceClaim from a template (made by
the real resourceclaim controller, allocated and reserved by the real scheduler). `FakeKubelet`
plays the kubelet for that node only: a pod bound there becomes Running, a pod being deleted
becomes Succeeded and is then deleted (grace 0, UID precondition), as the kubelet does once its
claims are unprepared; so the drain sees what it would see on a real node.

The rest of the cluster (the envelope) is `fill()`: `other_pods` plain pods bound by spec.nodeName
to `other_nodes` other fake nodes and `other_claims` ResourceClaims, spread over other namespaces.

The drain runs as its own ServiceAccount (ROLE: exactly what `dra-guard drain` needs, plus the RBAC
lists it uses for driver detection) and its requests are read from the audit log (ResponseComplete
lines of that user written during the run) and counted by verb and resource. Also counted:
`rounds` (lists of the node's ResourceSlices: one per round of about a second), the distinct
objects and selectors asked about (`targets`), and `unscoped`: every list or watch of pods,
ResourceClaims or ResourceSlices that is not limited to the node by field selector (must be empty).

    python -m bench.drain_requests                       # 5, 20, 50 pods on the node; 0 and 2,000 others
    python -m bench.drain_requests --node-pods 5 --other-pods 0,500 --out /tmp/drain.json
    python -m bench.drain_requests --node-pods 5,20 --hold-seconds 10 --out bench/results/unreleased/drain-requests-hold10.json

`--hold-seconds` keeps each evicted pod Terminating that long (a slow stop or unprepare), so that
the drain waits several rounds and the cost of a round shows. Prints a table and writes
bench/results/unreleased/drain-requests.json. Exit code 0 when every drain finished
(exit 0) with no unscoped request, 1 otherwise. tests/e2e/test_drain_requests.py runs it small.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import yaml

from bench.common import RESULTS
from tests.e2e import objects
from tests.e2e.fakekubelet import NO_KUBELET, FakeKubelet

REPO = pathlib.Path(__file__).resolve().parents[1]

NAMESPACE = "drain-requests"
DRIVER = "drain-requests.example.com"
DEVICE_CLASS = "drain-requests-gpu"
#: the drain's own identity: a ServiceAccount in NAMESPACE bound to ROLE
ACCOUNT = "drainer"
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
#: the envelope's objects: namespaces ENVELOPE-<i>, nodes ENVELOPE-node-<i>
ENVELOPE = "drain-envelope"
#: what `dra-guard drain` needs (webhook.kube.nodedrain.REQUIRED) and Events on the Node, plus the
#: RBAC lists it reads once for driver detection (skipped when not allowed; granted here so that
#: the measurement includes them); no nodes/proxy: a fake node has no kubelet to proxy to
ROLE_RULES = objects.DRAIN_USER_RULES

Wait = Callable[[str, Callable[[], Any], float], Any]


def _apply(cp: Any, objects: Sequence[dict[str, Any]]) -> None:
    cp.kubectl("admin", "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))


def _post(session: Any, url: str, body: dict[str, Any]) -> None:
    """POST `body`; an object that exists already (409) is fine. RuntimeError on other refusals."""
    r = session.post(url, json=body, timeout=30)
    if r.status_code not in (200, 201, 409):
        raise RuntimeError(f"POST {url}: HTTP {r.status_code} {r.text[:300]}")


def prepare(cp: Any, workdir: pathlib.Path) -> dict[str, Any]:
    """The objects every drain shares: NAMESPACE, the DeviceClass, the claim template, the drain's
    ServiceAccount bound to ROLE. Returns {"kubeconfig": path of the drain user's kubeconfig
    (a one-hour token), "config": path of dra-guard's config (drivers declared per node by
    drain_once())}."""
    cp.kubectl("admin", "create", "namespace", NAMESPACE, check=False)
    _apply(
        cp,
        [
            objects.device_class(DEVICE_CLASS, DRIVER),
            objects.claim_template(NAMESPACE, DEVICE_CLASS),
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": NAMESPACE},
                "rules": ROLE_RULES,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": NAMESPACE},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAMESPACE},
                "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
            },
        ],
    )
    token = cp.kubectl("admin", "create", "token", ACCOUNT, "-n", NAMESPACE, "--duration=1h").stdout.strip()
    config = yaml.safe_load(cp.kubeconfig("admin").read_text())
    config["users"][0]["user"] = {"token": token}
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = workdir / "drainer.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    return {"kubeconfig": kubeconfig, "workdir": workdir}


def unprepare(cp: Any) -> None:
    """Remove what prepare() made (the drain's ClusterRole and binding, the DeviceClass, NAMESPACE)."""
    cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", NAMESPACE, "--ignore-not-found", check=False)
    cp.kubectl("admin", "delete", "deviceclass", DEVICE_CLASS, "--ignore-not-found", check=False)
    cp.kubectl("admin", "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)


def fill(
    cp: Any, *, other_pods: int, other_nodes: int = 20, other_claims: int = 200, namespaces: int = 10, workers: int = 8
) -> dict[str, int]:
    """The envelope: `other_nodes` fake nodes, `other_pods` plain pods bound round-robin to them by
    spec.nodeName and `other_claims` ResourceClaims (unallocated), over `namespaces` namespaces.
    Idempotent (existing objects are kept), so a second call with more pods adds the difference.
    Returns the counts asked for."""
    from tests.e2e.cluster import fake_node

    session = cp.session("admin")
    url = cp.url
    nodes = [f"{ENVELOPE}-node-{i:02d}" for i in range(other_nodes)]
    names = [f"{ENVELOPE}-{i:02d}" for i in range(namespaces)]
    for node in nodes:
        _post(session, f"{url}/api/v1/nodes", fake_node(node))
    for ns in names:
        _post(session, f"{url}/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def pod(i: int) -> None:
        ns = names[i % len(names)]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"other-{i:05d}", "namespace": ns},
            "spec": {
                "nodeName": nodes[i % len(nodes)],
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "registry.example/app:v1"}],
            },
        }
        _post(session, f"{url}/api/v1/namespaces/{ns}/pods", body)

    def claim(i: int) -> None:
        ns = names[i % len(names)]
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"other-{i:05d}", "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}},
        }
        _post(session, f"{url}/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", body)

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(pod, range(other_pods)))
        list(pool.map(claim, range(other_claims if other_pods else 0)))
    return {"other_pods": other_pods, "other_nodes": other_nodes, "other_claims": other_claims if other_pods else 0}


def unfill(cp: Any) -> None:
    """Remove the envelope: its pods (grace 0: no kubelet will confirm them) and claims by
    collection, then its namespaces and nodes."""
    session = cp.session("admin")
    url = cp.url
    namespaces = session.get(f"{url}/api/v1/namespaces", timeout=30).json().get("items", [])
    for ns in (n["metadata"]["name"] for n in namespaces if n["metadata"]["name"].startswith(f"{ENVELOPE}-")):
        session.delete(f"{url}/api/v1/namespaces/{ns}/pods", json={"gracePeriodSeconds": 0}, timeout=60)
        session.delete(f"{url}/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", timeout=60)
        session.delete(f"{url}/api/v1/namespaces/{ns}", timeout=30)
    nodes = session.get(f"{url}/api/v1/nodes", timeout=30).json().get("items", [])
    for node in (n["metadata"]["name"] for n in nodes if n["metadata"]["name"].startswith(f"{ENVELOPE}-node-")):
        session.delete(f"{url}/api/v1/nodes/{node}", timeout=30)


def node_objects(node: str, pods: int) -> list[dict[str, Any]]:
    """The drained node's ResourceSlice (a device per consumer), its driver DaemonSet and `pods`
    consumers (bare pods, each with a claim from the template)."""
    from tests.builders import driver_daemonset

    ds = driver_daemonset(name=f"driver-{node}", namespace=NAMESPACE, plugin_subdir=DRIVER, sa="default")
    spec = ds["spec"]["template"]["spec"]
    spec.update(nodeSelector={"kubernetes.io/hostname": node}, tolerations=NO_KUBELET, terminationGracePeriodSeconds=1)
    consumers = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{node}-c{i:03d}", "namespace": NAMESPACE, "labels": {"app": f"{node}-c{i:03d}"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": NO_KUBELET,
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
                "containers": [{"name": "c", "image": "registry.example/app:v1", "resources": {"claims": [{"name": "gpu"}]}}],
            },
        }
        for i in range(pods)
    ]
    slice_ = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-slice"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(max(pods, 1))],
        },
    }
    return [slice_, ds, *consumers]


def _on_node(cp: Any, node: str) -> list[dict[str, Any]]:
    r = cp.session("admin").get(f"{cp.url}/api/v1/namespaces/{NAMESPACE}/pods?fieldSelector=spec.nodeName={node}", timeout=30)
    return list(r.json().get("items", []))


def _reserved(cp: Any, pods: Iterable[dict[str, Any]]) -> int:
    uids = {p["metadata"]["uid"] for p in pods}
    claims = cp.session("admin").get(f"{cp.url}/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims", timeout=30)
    return sum(
        1
        for c in claims.json().get("items", [])
        if any(r.get("uid") in uids for r in (c.get("status") or {}).get("reservedFor") or [])
    )


def audit_offset(cp: Any) -> int:
    """The audit log's size now: audit_since() reads what is written after it."""
    return int(cp.audit_log_path.stat().st_size)


def audit_since(cp: Any, offset: int, user: str) -> list[dict[str, Any]]:
    """The ResponseComplete audit events of `user` written after byte `offset` (a line being
    written is skipped)."""
    needle = f'"username":"{user}"'
    out = []
    with cp.audit_log_path.open() as fh:
        fh.seek(offset)
        for line in fh:
            if needle not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("stage") == "ResponseComplete":
                out.append(event)
    return out


def request_kind(event: dict[str, Any]) -> str:
    """ "VERB RESOURCE[/SUBRESOURCE]" of an audit event ("get discovery" for non-resource URLs)."""
    ref = event.get("objectRef") or {}
    if not ref.get("resource"):
        return f"{event['verb']} discovery"
    return f"{event['verb']} {ref['resource']}" + (f"/{ref['subresource']}" if ref.get("subresource") else "")


def field_selector(event: dict[str, Any]) -> str:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(event.get("requestURI", "")).query)
    return (query.get("fieldSelector") or [""])[0]


#: what a drain may list or watch only with the field selector spec.nodeName=NODE (ResourceClaims
#: it reads by name only, and no field selector of theirs names a node)
NODE_SCOPED = ("pods", "resourceclaims", "resourceslices")


def unscoped(events: Iterable[dict[str, Any]], node: str) -> list[str]:
    """Requests that ask about more than the node: a list or watch of NODE_SCOPED resources
    without the field selector spec.nodeName=`node` ("VERB requestURI" each)."""
    return [
        f"{e['verb']} {e.get('requestURI', '')}"
        for e in events
        if e["verb"] in ("list", "watch")
        and (e.get("objectRef") or {}).get("resource") in NODE_SCOPED
        and field_selector(e) != f"spec.nodeName={node}"
    ]


def targets(events: Iterable[dict[str, Any]]) -> set[tuple[str, ...]]:
    """The distinct things asked about: (verb, resource, namespace, name or field selector)."""
    out = set()
    for e in events:
        ref = e.get("objectRef") or {}
        out.add(
            (
                e["verb"],
                request_kind(e).partition(" ")[2],
                ref.get("namespace", ""),
                ref.get("name", "") or field_selector(e) or urllib.parse.urlsplit(e.get("requestURI", "")).path,
            )
        )
    return out


def drain_once(
    cp: Any, shared: dict[str, Any], node: str, pods: int, *, wait: Wait, timeout: float = 120, hold: float = 0.0
) -> dict[str, Any]:
    """A fresh fake `node` with the driver and `pods` consumers (all Running, every claim reserved),
    drained by `dra-guard drain NODE --evict-drivers` as USER, its pods leaving `hold` seconds
    after their eviction (FakeKubelet); the node and what is left on it are removed after.
    Returns {"node", "node_pods", "hold_seconds", "exit", "seconds", "requests", "by_kind":
    {kind: count}, "rounds", "targets", "unscoped": [...], "output": the drain's last lines}."""
    from tests.e2e.cluster import fake_node

    session = cp.session("admin")
    _post(session, f"{cp.url}/api/v1/nodes", fake_node(node, pods=str(max(110, pods + 10))))
    config = shared["workdir"] / f"{node}.yaml"
    config.write_text(yaml.safe_dump({"drivers": {"declared": [{"namespace": NAMESPACE, "name": f"driver-{node}"}]}}))
    try:
        with FakeKubelet(cp, node, hold_seconds=hold):
            _apply(cp, node_objects(node, pods))
            wait(
                f"the driver and {pods} consumers Running on {node}",
                lambda: len([p for p in _on_node(cp, node) if p["status"].get("phase") == "Running"]) == pods + 1 or None,
                max(60.0, pods * 2.0),
            )
            wait(f"{pods} claims reserved on {node}", lambda: _reserved(cp, _on_node(cp, node)) == pods or None, 60)
            offset = audit_offset(cp)
            argv = [sys.executable, "-m", "webhook.cli", "drain", node, "--evict-drivers", "--timeout", f"{timeout:g}s"]
            argv += ["-o", "json", "--kubeconfig", str(shared["kubeconfig"]), "--config", str(config)]
            started = time.monotonic()
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 60, cwd=REPO)
            seconds = time.monotonic() - started
            time.sleep(1.0)  # the last watch's ResponseComplete line lands just after the drain exits
            events = audit_since(cp, offset, USER)
    finally:
        cp.kubectl("admin", "delete", "daemonset", "-n", NAMESPACE, f"driver-{node}", "--wait=false", check=False)
        left = [p["metadata"]["name"] for p in _on_node(cp, node)]
        if left:
            cp.kubectl(
                "admin", "delete", "pod", "-n", NAMESPACE, *left, "--grace-period=0", "--force", "--wait=false", check=False
            )
        cp.kubectl("admin", "delete", "resourceslice", f"{node}-slice", "--wait=false", check=False)
        cp.kubectl("admin", "delete", "node", node, "--wait=false", check=False)
    by_kind = collections.Counter(request_kind(e) for e in events)
    return {
        "node": node,
        "node_pods": pods,
        "hold_seconds": hold,
        "exit": proc.returncode,
        "seconds": round(seconds, 1),
        "requests": len(events),
        "by_kind": dict(sorted(by_kind.items())),
        "rounds": by_kind.get("list resourceslices", 0),
        "targets": len(targets(events)),
        "unscoped": unscoped(events, node),
        "output": (proc.stdout + proc.stderr).strip().splitlines()[-3:],
    }


def table(runs: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of the runs: one row each, the request kinds as columns."""
    kinds = sorted({k for r in runs for k in r["by_kind"]})
    head = ["pods on node", "other pods", "hold s", "exit", "seconds", "rounds", "requests", "targets", *kinds]
    rows = [
        [
            str(r["node_pods"]),
            str(r["other_pods"]),
            f"{r['hold_seconds']:g}",
            str(r["exit"]),
            f"{r['seconds']:g}",
            str(r["rounds"]),
            str(r["requests"]),
            str(r["targets"]),
            *(str(r["by_kind"].get(k, 0)) for k in kinds),
        ]
        for r in runs
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def run(
    cp: Any,
    workdir: pathlib.Path,
    *,
    node_pods: Sequence[int],
    other_pods: Sequence[int],
    other_nodes: int = 20,
    other_claims: int = 200,
    wait: Wait,
    timeout: float = 120,
    hold: float = 0.0,
) -> list[dict[str, Any]]:
    """For each envelope size in `other_pods` (ascending; fill() adds to the last), a drain of a
    fresh node with each count in `node_pods`. Returns drain_once()'s results, each with
    "other_pods", "other_nodes" and "other_claims" added."""
    shared = prepare(cp, workdir)
    runs = []
    for others in sorted(other_pods):
        size = fill(cp, other_pods=others, other_nodes=other_nodes if others else 0, other_claims=other_claims)
        for pods in node_pods:
            result = drain_once(cp, shared, f"drain-req-{pods}-{others}", pods, wait=wait, timeout=timeout, hold=hold)
            runs.append({**result, **size})
    return runs


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Start a control plane (audit log on) and run(); print the table, write the JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.drain_requests", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--node-pods", type=_ints, default=[5, 20, 50], help="consumers on the drained node (default 5,20,50)")
    parser.add_argument("--other-pods", type=_ints, default=[0, 2000], help="pods elsewhere (default 0,2000)")
    parser.add_argument("--other-nodes", type=int, default=20, help="nodes they are bound to (default 20)")
    parser.add_argument("--other-claims", type=int, default=200, help="ResourceClaims elsewhere (default 200)")
    parser.add_argument("--timeout", type=float, default=120, help="the drain's --timeout in seconds (default 120)")
    parser.add_argument(
        "--hold-seconds", type=float, default=0.0, help="how long an evicted pod stays Terminating (default 0: at once)"
    )
    parser.add_argument("--out", default=str(RESULTS / "drain-requests.json"))
    args = parser.parse_args(argv)

    from tests.e2e import binaries
    from tests.e2e.cluster import ControlPlane
    from tests.e2e.kube import wait_for

    with (
        tempfile.TemporaryDirectory(prefix="dra-guard-drain-requests-") as tmp,
        ControlPlane(
            pathlib.Path(tmp) / "cp",
            controllers=True,
            audit_log=True,
            bin_dir=binaries.build_control_plane(),
            tools_dir=binaries.client_tools_dir(),
        ) as cp,
    ):
        runs = run(
            cp,
            pathlib.Path(tmp) / "work",
            node_pods=args.node_pods,
            other_pods=args.other_pods,
            other_nodes=args.other_nodes,
            other_claims=args.other_claims,
            wait=lambda what, fn, t: wait_for(what, fn, timeout=t),
            timeout=args.timeout,
            hold=args.hold_seconds,
        )
    result = {
        "command": "dra-guard drain NODE --evict-drivers -o json",
        "user": USER,
        "runs": runs,
    }
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(table(runs))
    bad = [r for r in runs if r["exit"] != 0 or r["unscoped"]]
    for r in bad:
        print(f"{r['node']}: exit {r['exit']}, unscoped {r['unscoped']}: {r['output']}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
