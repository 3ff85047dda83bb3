"""Two evictions of a driver's surge pair sent together to TWO dra-guard replicas: at most one pod
leaves while a claim is held (webhook.kube.records: the shared record, a Lease per DaemonSet and
node), on the real control plane.

Two real `dra-guard serve` processes stand behind one webhook URL: a small HTTPS proxy in this test
that hands each admission review to the next replica in turn (an L7 load balancer), so the two
evictions of a trial are judged by different replicas, as two of the chart's three replicas
behind its Service usually do. Each replica's own metrics prove the split. The node is a fake one
(no kubelet): the real DaemonSet controller runs the surge (maxSurge 1, minReadySeconds 3600 so
it keeps both pods), the test sets the driver pods' Ready condition, the real scheduler allocates
and reserves a consumer's claim on the node.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import http.server
import itertools
import json
import ssl
import threading
import time

import pytest

from tests.builders import driver_daemonset, eviction_request
from tests.e2e import objects
from tests.e2e.cluster import TOLERATE_ALL, fake_node
from tests.e2e.guard import EVICTION_REFUSED, NAMESPACE, Guard, chart_namespaced_rbac, webhook_configurations
from tests.e2e.kube import apply_objects, evict, wait_for
from tests.scrape import metric, scrape
from tests.serve import free_port

NODE = "e2e-replicas"
DRIVER = "replicas.example.com"
DRIVER_NS = "replicas-driver"
DS = "replicas-driver"
WORK = "replicas-work"
TRIALS = 20

DRA_OBJECTS = [
    objects.device_class("e2e-replicas", DRIVER),
    objects.node_slice(NODE, DRIVER),
    objects.namespace(WORK),
    objects.namespace(DRIVER_NS),
    objects.claim_template(WORK, "e2e-replicas"),
    objects.consumer("consumer", WORK, NODE, TOLERATE_ALL),
]


class RoundRobinProxy:
    """HTTPS on 127.0.0.1:`port` with `cert`/`key`; each POST goes to the next of `backends`
    ((url, ca_file) pairs) in turn, per path, over a new TLS connection; the answer is passed back."""

    def __init__(self, port: int, cert: str, key: str, backends: list[tuple[str, str]]) -> None:
        turns: dict[str, itertools.count] = {}
        lock = threading.Lock()
        contexts = [ssl.create_default_context(cafile=ca) for _, ca in backends]

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    turn = next(turns.setdefault(self.path.split("?")[0], itertools.count()))
                url, context = backends[turn % len(backends)][0], contexts[turn % len(backends)]
                host, port = url.removeprefix("https://").rsplit(":", 1)
                conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
                try:
                    conn.request("POST", self.path, body=body, headers={"Content-Type": self.headers["Content-Type"]})
                    resp = conn.getresponse()
                    data, status, ctype = resp.read(), resp.status, resp.getheader("Content-Type", "application/json")
                finally:
                    conn.close()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def keep_node_ready(cp, stop: threading.Event) -> None:
    """Renew the fake node's Ready heartbeat every 5 s: without one the node lifecycle controller
    marks the node's pods NotReady after its grace period, and the surge pair would be gone."""
    while not stop.wait(5):
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cp.session("admin").patch(
            f"{cp.url}/api/v1/nodes/{NODE}/status",
            timeout=10,
            data=json.dumps(
                {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "FakeNode", "lastHeartbeatTime": now}]}}
            ),
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )


@pytest.fixture(scope="module")
def replicas(control_plane, tmp_path_factory):
    cp = control_plane
    stop = threading.Event()
    cp.session("admin").post(f"{cp.url}/api/v1/nodes", json=fake_node(NODE), timeout=10).raise_for_status()
    threading.Thread(target=keep_node_ready, args=(cp, stop), daemon=True).start()
    apply_objects(cp, *DRA_OBJECTS)
    ds = driver_daemonset(
        name=DS,
        namespace=DRIVER_NS,
        plugin_subdir=DRIVER,
        strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
    )
    ds["spec"]["minReadySeconds"] = 3600  # the controller keeps the old pod while the new one is Ready
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    ds["spec"]["template"]["spec"]["tolerations"] = TOLERATE_ALL
    guards = [Guard(cp, tmp_path_factory.mktemp(f"dra-guard-replica-{i}")) for i in (1, 2)]
    proxy = None
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda g: g.start(mode="enforce", declared=((DRIVER_NS, DS),)), guards))
        one = guards[0]
        proxy = RoundRobinProxy(
            free_port(),
            str(one.workdir / "tls" / "tls.crt"),
            str(one.workdir / "tls" / "tls.key"),
            [(g.url, str(g.proc.ca_file)) for g in guards],
        )
        url = f"https://127.0.0.1:{proxy.server.server_address[1]}"
        configs = webhook_configurations(url=url, ca_file=one.proc.ca_file, declared=((DRIVER_NS, DS),))
        apply_objects(cp, *configs)
        one.wait_called()
        apply_objects(cp, ds)
        yield guards
    finally:
        stop.set()
        guards[0].unregister()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda g: g.stop_server(), guards))
        if proxy is not None:
            proxy.stop()
        cp.kubectl("admin", "delete", "daemonset", "-n", DRIVER_NS, DS, "--wait=false", check=False)
        for ns in (WORK, DRIVER_NS):
            cp.kubectl("admin", "delete", "pods", "-n", ns, "--all", "--grace-period=0", "--force", "--wait=false", check=False)
        cp.kubectl(
            "admin",
            "delete",
            "-f",
            "-",
            "--wait=false",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": DRA_OBJECTS}),
            check=False,
        )
        cp.kubectl("admin", "delete", "node", NODE, "--wait=false", check=False)


def driver_pods(cp) -> list[dict]:
    """The DaemonSet's pods on NODE that are not Terminating."""
    pods = cp.session("admin").get(f"{cp.url}/api/v1/namespaces/{DRIVER_NS}/pods", timeout=10).json()["items"]
    return [p for p in pods if p["spec"].get("nodeName") == NODE and not p["metadata"].get("deletionTimestamp")]


def is_ready(p) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])


def set_ready(cp, p) -> None:
    """Ready, as a kubelet would report it (none runs on the fake node)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cp.session("admin").patch(
        f"{cp.url}/api/v1/namespaces/{DRIVER_NS}/pods/{p['metadata']['name']}/status",
        timeout=10,
        data=json.dumps(
            {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}}
        ),
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    ).raise_for_status()


def pair_ready(cp, trial: int) -> list[str] | None:
    """The two Ready pods of a surge pair on NODE, or None yet: a lone pod of the current template
    gets a new template (the controller surges); new pods are set Ready."""
    pods = driver_pods(cp)
    for p in pods:
        if not is_ready(p):
            set_ready(cp, p)
    if len(pods) == 1:
        ds = cp.session("admin").get(f"{cp.url}/apis/apps/v1/namespaces/{DRIVER_NS}/daemonsets/{DS}", timeout=10).json()
        current = ds["metadata"].get("annotations", {}).get("deprecated.daemonset.template.generation")
        if pods[0]["metadata"]["labels"].get("pod-template-generation") == current:  # else the controller surges itself
            cp.session("admin").patch(
                f"{cp.url}/apis/apps/v1/namespaces/{DRIVER_NS}/daemonsets/{DS}",
                timeout=10,
                data=json.dumps({"spec": {"template": {"metadata": {"annotations": {"e2e/pair": str(trial)}}}}}),
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()
    return [p["metadata"]["name"] for p in pods] if len(pods) == 2 and all(is_ready(p) for p in pods) else None


def sees_peers(guard, pair: list[str]) -> bool:
    """This replica's own answer to a dry-run eviction of each pod: allowed on the strength of the
    other (the claim is held: the seamless-upgrade warning). A dry run writes no record."""
    session = guard.proc.session()
    for name in pair:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": eviction_request(name, namespace=DRIVER_NS, dry_run=True),
        }
        answer = session.post(guard.url + "/validate/evictions", json=review, timeout=10).json()["response"]
        if not (answer["allowed"] and any("seamless upgrade" in w for w in answer.get("warnings", []))):
            return False
    return True


def reviews(guard) -> float:
    """Eviction reviews this replica answered (every decision)."""
    return metric(scrape(guard.proc), "dra_guard_admission_requests_total", policy="eviction", default=0.0)


def test_two_evictions_of_a_surge_pair_sent_together_to_two_replicas_never_both_leave_while_a_claim_is_held(
    control_plane, replicas
):
    cp, guards = control_plane, replicas
    outcomes, split, started = [], 0, time.monotonic()
    for trial in range(TRIALS):
        pair = wait_for("a Ready surge pair", lambda t=trial: pair_ready(cp, t), timeout=60, interval=0.2)
        wait_for(
            "both replicas to see the pair as peers with the claim held",
            lambda p=pair: all(sees_peers(g, p) for g in guards),
            timeout=60,
            interval=0.2,
        )
        before = [reviews(g) for g in guards]
        barrier = threading.Barrier(2)

        def send(name, barrier=barrier):
            barrier.wait()
            return evict(cp, DRIVER_NS, name, grace=0).status_code

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            codes = list(pool.map(send, pair))
        outcomes.append(codes)
        if [reviews(g) - b for g, b in zip(guards, before, strict=True)] == [1, 1]:
            split += 1
        assert codes.count(201) <= 1, f"trial {trial}: both driver pods evicted while a claim is held: {outcomes}"
        assert all(code in (201, 429) for code in codes), outcomes
        evicted = {n for n, c in zip(pair, codes, strict=True) if c == 201}
        wait_for(
            "the evicted pod gone",
            lambda e=evicted: not e & {p["metadata"]["name"] for p in driver_pods(cp)},
            timeout=30,
            interval=0.1,
        )
    records = {
        r: sum(metric(scrape(g.proc), "dra_guard_eviction_records_total", result=r, default=0.0) for g in guards)
        for r in ("created", "taken_over", "conflict", "error")
    }
    print(
        f"outcomes {outcomes}; split over both replicas in {split} of {TRIALS}; records {records}; "
        f"{time.monotonic() - started:.1f} s"
    )
    assert split >= TRIALS * 3 // 4, f"the reviews were not split over the two replicas: {split} of {TRIALS}"
    assert sum(codes.count(201) == 1 for codes in outcomes) >= TRIALS * 3 // 4, outcomes  # the peer rule still lets one go
    assert records["conflict"] >= 1 and records["error"] == 0, records  # the race happened, and the record settled it


def test_a_record_that_cannot_be_written_refuses_in_enforce_mode_and_the_pair_goes_again_once_it_can(control_plane, replicas):
    """The replicas may not write Leases (the chart's RoleBinding gone): a driver pod with a Ready
    peer is refused with 429 naming the cause (fail closed on this narrow scope; drains retry), and
    allowed again once the RoleBinding is back."""
    cp, guards = control_plane, replicas
    pair = wait_for("a Ready surge pair", lambda: pair_ready(cp, TRIALS), timeout=60, interval=0.2)
    wait_for("both replicas to see the pair as peers", lambda: all(sees_peers(g, pair) for g in guards), timeout=60, interval=0.2)
    errors = sum(metric(scrape(g.proc), "dra_guard_eviction_records_total", result="error", default=0.0) for g in guards)

    def may_write_leases() -> bool:
        return (
            cp.kubectl(
                "admin", "auth", "can-i", "update", "leases", "-n", NAMESPACE, "--as", "dra-guard", check=False
            ).stdout.strip()
            == "yes"
        )

    cp.kubectl("admin", "delete", "rolebinding", "-n", NAMESPACE, "dra-guard")
    try:
        wait_for("the Lease rights gone", lambda: not may_write_leases(), timeout=30)
        r = evict(cp, DRIVER_NS, pair[0], grace=0)
        assert r.status_code == 429, r.text
        message = r.json()["message"]
        assert message.startswith(EVICTION_REFUSED) and "the record could not be written" in message, message
        assert "403" in message, message
        assert (
            sum(metric(scrape(g.proc), "dra_guard_eviction_records_total", result="error", default=0.0) for g in guards)
            == errors + 1
        )
    finally:
        apply_objects(cp, *chart_namespaced_rbac())
    wait_for("the Lease rights back", may_write_leases, timeout=30)
    assert evict(cp, DRIVER_NS, pair[0], grace=0).status_code == 201
