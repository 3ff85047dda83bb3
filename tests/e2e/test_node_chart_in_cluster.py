"""The chart installed for real, as a user installs a release: the image built here from the
Dockerfile (tests/e2e/image.py) is pushed to a real registry on loopback (tests/e2e/registry.py)
and pulled from it by the real node's containerd when the kubelet starts the pod (nothing is
imported beforehand), referenced by its digest (`image.digest`); the chart is packaged
(`helm package`), pushed as an OCI artifact (`helm push`) and installed and upgraded from there
(`helm install oci://...`).

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
import pathlib
import tarfile
import time
from dataclasses import dataclass

import pytest
import yaml

from tests.chart import helm
from tests.e2e.kube import wait_for
from tests.serve import free_port

RELEASE = "dra-guard"
NS = "dra-guard"
MANIFESTS_RBAC = helm.REPO / "tests" / "e2e" / "manifests" / "rbac-managers.yaml"


@pytest.fixture(scope="module")
def installed(real_node_in_cluster, dra_guard_image, registry, tmp_path_factory):
    """(real node, image pushed: (repository, digest), values, folder, chart reference) with the image
    and the chart in the registry and nothing of dra-guard in the node's containerd."""
    rn = real_node_in_cluster
    folder = tmp_path_factory.mktemp("helm")
    started = time.monotonic()
    digest = registry.push_image(dra_guard_image.archive, "dra-guard", dra_guard_image.tag)
    repository = f"{registry.host}/dra-guard"
    rn.node.trust_plain_http_registry(registry.host)
    env = rn.cp.env("admin")
    packaged = helm.run("package", str(helm.CHART), "-d", str(folder), env=env)
    archive = pathlib.Path(packaged.stdout.strip().rpartition(": ")[2])
    version = yaml.safe_load((helm.CHART / "Chart.yaml").read_text())["version"]
    assert archive.name == f"dra-guard-{version}.tgz", packaged.stdout
    pushed = helm.run("push", str(archive), f"oci://{registry.host}/charts", "--plain-http", env=env)
    print(f"\npush image + package and push chart: {time.monotonic() - started:.1f} s")
    said = pushed.stdout + pushed.stderr
    assert f"Pushed: {registry.host}/charts/dra-guard:{version}" in said, said
    # the registry's own answer for both: the chart under its version, the image under its tag
    # with the manifest digest of the archive built here (copied as is)
    assert f"Digest: {registry.manifest_digest('charts/dra-guard', version)}" in said, said
    assert registry.manifest_digest("dra-guard", dra_guard_image.tag) == digest == archive_manifest_digest(dra_guard_image)
    assert not [
        ref for ref in rn.node.ctr("images", "ls", "-q").stdout.split() if "dra-guard:" in ref or ref.startswith(repository)
    ], "the dra-guard image is already in containerd: nothing would be pulled"
    values = {
        # by digest, as a release is pinned; IfNotPresent: the kubelet pulls it once
        "image": {"repository": repository, "digest": digest, "pullPolicy": "IfNotPresent"},
        "replicaCount": 1,
        "hostNetwork": True,
        # one node and the webhook port taken on it: the new pod can only start once the old one is gone
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(rn.cp.apiserver_port)},
        ],
        # on the host's network: a free port, not 8443 which another program may hold
        "config": {"server": {"port": free_port()}},
        "preDelete": {"enabled": True},
    }
    chart = Chart(f"oci://{registry.host}/charts/dra-guard", version)
    return rn, (repository, digest), values, folder, chart


def archive_manifest_digest(image) -> str:
    """The manifest digest in the OCI archive's index.json (tests/e2e/image.py writes one image)."""
    with tarfile.open(image.archive) as tar:
        index = json.load(tar.extractfile("index.json"))
    return index["manifests"][0]["digest"]


@dataclass(frozen=True)
class Chart:
    """The chart as installed from the registry: `ref` (``oci://HOST/charts/dra-guard``), `version`."""

    ref: str
    version: str

    def args(self) -> list[str]:
        return [self.ref, "--version", self.version, "--plain-http"]


def chart_fetches(registry, chart) -> int:
    """How many times helm has fetched the chart's manifest by its version (install, upgrade, pull)."""
    return sum(
        1
        for r in registry.requests()
        if r.agent.startswith("Helm/")
        and r.method == "GET"
        and r.path == f"/v2/charts/dra-guard/manifests/{chart.version}"
        and r.status == 200
    )


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
    return [
        p
        for p in pods
        if "deletionTimestamp" not in p["metadata"]
        and [o["kind"] for o in p["metadata"].get("ownerReferences", [])] == ["ReplicaSet"]
    ]


def refused_binding(cp, name: str):
    """alice (an RBAC manager, not an admin: sent to the RBAC webhook) binds a ClusterRole that
    writes resourceslices to a group: what the RBAC guard refuses."""
    doc = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "subjects": [{"kind": "Group", "name": "team-b", "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"kind": "ClusterRole", "name": "e2e-slice-writer", "apiGroup": "rbac.authorization.k8s.io"},
    }
    return cp.kubectl("alice", "create", "-f", "-", input=json.dumps(doc), check=False)


def test_install_serve_through_the_service_helm_test_upgrade_and_uninstall(installed, registry):
    rn, (repository, digest), values, folder, chart = installed
    cp, node = rn.cp, rn.node

    # install from the registry: the chart from oci://, the Deployment's pod runs the image built
    # here, pulled by digest from the registry by the node's containerd
    started = time.monotonic()
    helm_run(
        cp,
        folder,
        "install",
        RELEASE,
        *chart.args(),
        "-n",
        NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "240s",
        values=values,
    )
    print(f"\nhelm install --wait (image pulled from the registry): {time.monotonic() - started:.1f} s")
    assert chart_fetches(registry, chart) == 1, "helm install did not fetch the chart from the registry"
    release = json.loads(helm_run(cp, folder, "list", "-n", NS, "-o", "json").stdout)
    assert [(r["name"], r["chart"]) for r in release] == [(RELEASE, f"dra-guard-{chart.version}")], release
    pods = server_pods(cp)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    first = pods[0]
    assert first["status"]["phase"] == "Running" and first["spec"]["nodeName"] == node.name
    assert first["spec"]["containers"][0]["image"] == f"{repository}@{digest}"
    status = first["status"]["containerStatuses"][0]
    assert status["ready"] and status["imageID"] == f"{repository}@{digest}", status
    assert first["spec"]["securityContext"]["runAsUser"] == 65532
    # containerd pulled it from the registry: its record of the image is the registry's name and
    # digest, and the registry served that manifest and the layers to containerd
    assert f"{repository}@{digest}" in node.ctr("images", "ls", "-q").stdout.split()
    pulls = [r for r in registry.requests() if r.agent.startswith("containerd/")]
    assert any(r.path == f"/v2/dra-guard/manifests/{digest}" and r.status == 200 for r in pulls), pulls
    assert any(r.method == "GET" and r.path.startswith("/v2/dra-guard/blobs/sha256:") and r.status == 200 for r in pulls), pulls
    # ... over plain HTTP as the node's hosts.toml says: without it containerd 2.x tries HTTPS first
    # and falls back to HTTP only because the host is a loopback address (its log says so)
    log = node.containerd_log.read_text(errors="replace").splitlines()
    assert [line for line in log if f'PullImage \\"{repository}@{digest}\\"' in line], log[-20:]
    assert not [line for line in log if "try HTTPS first" in line and registry.host in line]

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
    cp.kubectl(
        "admin",
        "create",
        "clusterrole",
        "e2e-slice-writer",
        "--verb=create,update,delete",
        "--resource=resourceslices.resource.k8s.io",
    )
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
    helm_run(cp, folder, "upgrade", RELEASE, *chart.args(), "-n", NS, "--wait", "--timeout", "240s", values=values)
    assert chart_fetches(registry, chart) == 2, "helm upgrade did not fetch the chart from the registry"
    rolled = wait_for(
        "the old pod to go",
        lambda: (
            [p for p in server_pods(cp) if p["metadata"]["name"] != first["metadata"]["name"]]
            and len(server_pods(cp)) == 1
            and server_pods(cp)
        ),
        timeout=120,
    )
    assert rolled[0]["metadata"]["name"] != first["metadata"]["name"]
    assert rolled[0]["status"]["containerStatuses"][0]["ready"]
    refused = refused_binding(cp, "e2e-alice-slice-writers-2")
    assert refused.returncode != 0 and "denied the request" in refused.stderr, refused.stderr

    # uninstall with preDelete.enabled: helm waits for the Job, which deletes both configurations
    helm_run(cp, folder, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "180s")
    events = get(cp, "events", "-n", NS)["items"]
    job_events = {
        (e["involvedObject"]["kind"], e["reason"])
        for e in events
        if e["involvedObject"]["name"].startswith(f"{RELEASE}-pre-delete")
    }
    assert ("Job", "Completed") in job_events, sorted(job_events)
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        gone = cp.kubectl("admin", "get", kind, RELEASE, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    wait_for("the release's pods to go", lambda: not server_pods(cp), timeout=90)
