"""The chart installed for real (issue 20 item 4): `helm install` of charts/dra-guard with the image
built here from the Dockerfile (tests/e2e/image.py), imported into a real node's containerd.

The node (tests/e2e/node.py) has no kube-proxy, DNS or routes out: the pods use the chart's
`hostNetwork` and reach the apiserver at 127.0.0.1 through `extraEnv` (KUBERNETES_SERVICE_HOST/PORT,
read by the in-cluster configuration), and the apiserver reaches the webhook through its Service
(clientConfig.service, never url) with --enable-aggregator-routing, which makes it call one of the
Service's EndpointSlice addresses (ControlPlane(in_cluster=True)). One test walks the lifecycle in
order: install -> pods run, self-mode certificates made in-cluster, a refusal through the Service
-> `helm test` -> `helm upgrade` rolls the pod -> `helm uninstall` runs the pre-delete Job.
"""
from __future__ import annotations

import base64
import json
import time

import pytest

from tests.chart import helm
from tests.serve import free_port

RELEASE = "dra-guard"
NS = "dra-guard"
MANIFESTS_RBAC = helm.REPO / "tests" / "e2e" / "manifests" / "rbac-managers.yaml"


@pytest.fixture(scope="module")
def installed(real_node_in_cluster, dra_guard_image, tmp_path_factory):
    """(real node, image, values, folder) with the image imported into the node's containerd."""
    rn = real_node_in_cluster
    out = rn.node.ctr("images", "import", "--snapshotter", "overlayfs", str(dra_guard_image.archive), check=False)
    assert out.returncode == 0, out.stderr
    assert dra_guard_image.ref in rn.node.ctr("images", "ls", "-q").stdout.split()
    values = {
        "image": {"repository": dra_guard_image.repository, "tag": dra_guard_image.tag, "pullPolicy": "Never"},
        "replicaCount": 1,
        "hostNetwork": True,
        # one node and the webhook port taken on it: the new pod can only start once the old one is gone
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": str(rn.cp.apiserver_port)}],
        # on the host's network: a free port, not 8443 which another program may hold
        "config": {"server": {"port": free_port()}},
        "preDelete": {"enabled": True},
    }
    return rn, dra_guard_image, values, tmp_path_factory.mktemp("helm")


def helm_run(cp, folder, *args, values=None, timeout=300):
    # values files only where helm takes them (install, upgrade): `helm test` and `uninstall` refuse -f
    files = helm.values_args(values, folder) if values is not None else []
    out = helm.run(*args, *files, env=cp.env("admin"), check=False, timeout=timeout)
    assert out.returncode == 0, f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out


def get(cp, *args):
    return json.loads(cp.kubectl("admin", "get", "-o", "json", *args).stdout)


def server_pods(cp) -> list[dict]:
    """The release's Deployment pods not being deleted (the test pod and the Job's pod left out)."""
    pods = get(cp, "pods", "-n", NS)["items"]
    return [p for p in pods if "deletionTimestamp" not in p["metadata"]
            and [o["kind"] for o in p["metadata"].get("ownerReferences", [])] == ["ReplicaSet"]]


def wait_for(what, probe, timeout=120.0, interval=1.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def refused_binding(cp, name: str):
    """alice (an RBAC manager, not an admin: sent to the RBAC webhook) binds a ClusterRole that
    writes resourceslices to a group: what the RBAC guard refuses."""
    doc = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
           "subjects": [{"kind": "Group", "name": "team-b", "apiGroup": "rbac.authorization.k8s.io"}],
           "roleRef": {"kind": "ClusterRole", "name": "e2e-slice-writer", "apiGroup": "rbac.authorization.k8s.io"}}
    return cp.kubectl("alice", "create", "-f", "-", input=json.dumps(doc), check=False)


def test_install_serve_through_the_service_helm_test_upgrade_and_uninstall(installed):
    rn, image, values, folder = installed
    cp, node = rn.cp, rn.node

    # install: the Deployment's pod runs the image built here, on the real node
    started = time.monotonic()
    helm_run(cp, folder, "install", RELEASE, str(helm.CHART), "-n", NS, "--create-namespace",
             "--wait", "--timeout", "240s", values=values)
    print(f"\nhelm install --wait: {time.monotonic() - started:.1f} s")
    pods = server_pods(cp)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    first = pods[0]
    assert first["status"]["phase"] == "Running" and first["spec"]["nodeName"] == node.name
    status = first["status"]["containerStatuses"][0]
    assert status["ready"] and status["image"].endswith(image.ref.partition("/")[2]), status
    assert first["spec"]["securityContext"]["runAsUser"] == 65532

    # self mode: the CA and serving certificate were made in-cluster, by the pod, in a Secret of
    # the release namespace, and the caBundle of both webhook configurations was set by it
    secrets = [s for s in get(cp, "secrets", "-n", NS)["items"] if "tls.crt" in s.get("data", {})]
    assert secrets, "no Secret with a serving certificate in the release namespace"
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        for webhook in get(cp, kind, RELEASE)["webhooks"]:
            client = webhook["clientConfig"]
            assert "url" not in client and client["service"]["namespace"] == NS, client
            assert base64.b64decode(client["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")

    # reached through the Service: the apiserver sends alice's binding to the pod, which refuses it
    cp.kubectl("admin", "apply", "-f", str(MANIFESTS_RBAC))
    cp.kubectl("admin", "create", "clusterrole", "e2e-slice-writer", "--verb=create,update,delete",
               "--resource=resourceslices.resource.k8s.io")
    slices = get(cp, "endpointslices", "-n", NS, "-l", f"kubernetes.io/service-name={RELEASE}")["items"]
    assert any(ep.get("conditions", {}).get("ready") for s in slices for ep in s.get("endpoints") or []), slices
    refused = refused_binding(cp, "e2e-alice-slice-writers")
    assert refused.returncode != 0 and "denied the request" in refused.stderr, refused.stderr
    assert "resourceslices" in refused.stderr, refused.stderr
    log = node.container_log(NS, first["metadata"]["name"], "dra-guard")
    assert "e2e-alice-slice-writers" in log, log[-3000:]

    # helm test: its pod runs `dra-guard hook test` from the image and passes
    out = helm_run(cp, folder, "test", RELEASE, "-n", NS, "--timeout", "120s")
    assert "Phase:          Succeeded" in out.stdout or "Succeeded" in out.stdout, out.stdout

    # upgrade with a changed setting: the pod is rolled (a new pod, the old one gone)
    values["config"]["server"]["reviewDeadlineSeconds"] = 2.0
    helm_run(cp, folder, "upgrade", RELEASE, str(helm.CHART), "-n", NS, "--wait", "--timeout", "240s", values=values)
    rolled = wait_for("the old pod to go", lambda: [p for p in server_pods(cp)
                                                    if p["metadata"]["name"] != first["metadata"]["name"]]
                      and len(server_pods(cp)) == 1 and server_pods(cp))
    assert rolled[0]["metadata"]["name"] != first["metadata"]["name"]
    assert rolled[0]["status"]["containerStatuses"][0]["ready"]
    refused = refused_binding(cp, "e2e-alice-slice-writers-2")
    assert refused.returncode != 0 and "denied the request" in refused.stderr, refused.stderr

    # uninstall with preDelete.enabled: helm waits for the Job, which deletes both configurations
    helm_run(cp, folder, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "180s")
    events = get(cp, "events", "-n", NS)["items"]
    job_events = {(e["involvedObject"]["kind"], e["reason"]) for e in events
                  if e["involvedObject"]["name"].startswith(f"{RELEASE}-pre-delete")}
    assert ("Job", "Completed") in job_events, sorted(job_events)
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        gone = cp.kubectl("admin", "get", kind, RELEASE, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    wait_for("the release's pods to go", lambda: not server_pods(cp), timeout=90)
