"""The harness itself: the control plane serves DRA, enforces RBAC, runs its controllers,
audits requests, survives an apiserver restart, and cleans up after a failed start."""

from __future__ import annotations

import pathlib
import uuid

import pytest

from tests.e2e import binaries
from tests.e2e.cluster import TOLERATE_ALL, ControlPlane, ControlPlaneError, fake_node
from tests.e2e.kube import wait_for


def test_resource_k8s_io_v1_is_served(control_plane: ControlPlane) -> None:
    resp = control_plane.session("admin").get(f"{control_plane.url}/apis/resource.k8s.io", timeout=10)
    assert resp.status_code == 200, resp.text
    versions = [v["version"] for v in resp.json()["versions"]]
    assert "v1" in versions


def test_rbac_denies_an_ordinary_user_and_allows_admin(control_plane: ControlPlane) -> None:
    # alice and bob may be made RBAC managers by other modules (the session shares one cluster);
    # dra-guard's own user only ever gets list/watch
    user = control_plane.kubectl("dra-guard", "auth", "can-i", "create", "clusterrolebindings", check=False)
    admin = control_plane.kubectl("admin", "auth", "can-i", "create", "clusterrolebindings", check=False)
    assert user.stdout.strip() == "no", user
    assert admin.stdout.strip() == "yes", admin


def test_controller_manager_creates_default_service_account(control_plane: ControlPlane) -> None:
    sess = control_plane.session("admin")
    url = f"{control_plane.url}/api/v1/namespaces/default/serviceaccounts/default"
    wait_for("ServiceAccount default/default", lambda: sess.get(url, timeout=10).status_code == 200)


def test_scheduler_binds_pod_to_fake_node(control_plane: ControlPlane) -> None:
    sess = control_plane.session("admin")
    node_name = f"fake-{uuid.uuid4().hex[:8]}"
    pod_url = f"{control_plane.url}/api/v1/namespaces/default/pods"
    resp = sess.post(f"{control_plane.url}/api/v1/nodes", json=fake_node(node_name), timeout=10)
    assert resp.status_code == 201, resp.text
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": node_name},
            "spec": {
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                "nodeSelector": {"kubernetes.io/hostname": node_name},
                "tolerations": TOLERATE_ALL,
            },
        }
        resp = sess.post(pod_url, json=pod, timeout=10)
        assert resp.status_code == 201, resp.text
        bound = wait_for(
            f"pod {node_name} to be bound", lambda: sess.get(f"{pod_url}/{node_name}", timeout=10).json()["spec"].get("nodeName")
        )
        assert bound == node_name
    finally:
        sess.delete(f"{pod_url}/{node_name}", json={"gracePeriodSeconds": 0}, timeout=10)
        sess.delete(f"{control_plane.url}/api/v1/nodes/{node_name}", timeout=10)


def test_audit_log_records_alice(control_plane: ControlPlane) -> None:
    name = f"audit-probe-{uuid.uuid4().hex[:8]}"
    path = f"/api/v1/namespaces/default/configmaps/{name}"
    resp = control_plane.session("alice").get(control_plane.url + path, timeout=10)
    assert resp.status_code == 403
    events = wait_for(
        f"the audit event of GET {path}",
        lambda: [e for e in control_plane.audit_events("alice") if e["requestURI"] == path],
        timeout=5,
    )
    assert len(events) == 1, events
    assert events[0]["verb"] == "get"
    assert events[0]["responseStatus"]["code"] == 403
    assert "team-a" in events[0]["user"]["groups"]


def test_restart_apiserver_keeps_data(control_plane: ControlPlane) -> None:
    sess = control_plane.session("admin")
    name = f"restart-probe-{uuid.uuid4().hex[:8]}"
    cm_url = f"{control_plane.url}/api/v1/namespaces/default/configmaps"
    resp = sess.post(cm_url, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}, timeout=10)
    assert resp.status_code == 201, resp.text

    control_plane.restart_apiserver()

    sess = control_plane.session("admin")  # fresh connections
    assert sess.get(f"{control_plane.url}/readyz", timeout=10).text == "ok"
    assert sess.get(f"{cm_url}/{name}", timeout=10).status_code == 200
    sess.delete(f"{cm_url}/{name}", timeout=10)
    control_plane.check_alive()  # etcd and the controllers survived the restart


def test_failed_start_leaves_no_process(tmp_path: pathlib.Path) -> None:
    """A kube-apiserver that exits at once: start() raises with its log and stops etcd again."""
    real = binaries.build_control_plane()
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in binaries.CONTROL_PLANE:
        (fake / name).symlink_to(real / name)
    (fake / "kube-apiserver").unlink()
    (fake / "kube-apiserver").write_text("#!/bin/sh\necho 'boom: unknown flag' >&2\nexit 3\n")
    (fake / "kube-apiserver").chmod(0o755)
    cp = ControlPlane(tmp_path / "cluster", bin_dir=fake, tools_dir=binaries.client_tools_dir())
    with pytest.raises(ControlPlaneError, match=r"(?s)kube-apiserver exited with code 3.*boom: unknown flag"):
        cp.start()
    leftovers = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(cp.workdir).encode() in cmdline.read_bytes():
                leftovers.append(cmdline.parent.name)
        except OSError:
            pass
    assert leftovers == []
    cp.stop()  # idempotent
