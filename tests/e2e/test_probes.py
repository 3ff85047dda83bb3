"""Driver liveness probes through the real kube-apiserver (issue acceptance 5)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.builders import driver_daemonset


@pytest.fixture(scope="module", autouse=True)
def gpu_namespace(control_plane):
    control_plane.kubectl("admin", "create", "namespace", "gpu", check=False)


def get_ds(cp, name):
    return json.loads(cp.kubectl("admin", "get", "daemonset", "-n", "gpu", name, "-o", "json").stdout)


def test_apply_adds_probe_and_reapply_keeps_generation(control_plane, guard):
    cp = control_plane
    if guard.mode != "enforce":
        guard.start(mode="enforce")
        guard.wait_called()
    manifest = yaml.safe_dump(driver_daemonset(name="e2e-driver"))
    out = cp.kubectl("admin", "apply", "-f", "-", input=manifest)
    assert "created" in out.stdout
    stored = get_ds(cp, "e2e-driver")
    probe = stored["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    assert probe["grpc"] == {"port": 51515, "service": "liveness"}
    generation = stored["metadata"]["generation"]

    again = cp.kubectl("admin", "apply", "-f", "-", input=manifest)
    assert again.returncode == 0
    assert get_ds(cp, "e2e-driver")["metadata"]["generation"] == generation
    cp.kubectl("admin", "delete", "daemonset", "-n", "gpu", "e2e-driver")


def test_csi_plugin_is_stored_untouched(control_plane, guard):
    cp = control_plane
    manifest = yaml.safe_dump(driver_daemonset(name="e2e-csi", cdi=False, plugin_subdir="csi.example.com"))
    cp.kubectl("admin", "apply", "-f", "-", input=manifest)
    assert "livenessProbe" not in get_ds(cp, "e2e-csi")["spec"]["template"]["spec"]["containers"][0]
    cp.kubectl("admin", "delete", "daemonset", "-n", "gpu", "e2e-csi")


def test_warn_mode_prints_warning_and_stores_unchanged(control_plane, guard):
    cp = control_plane
    guard.start(mode="warn")
    guard.wait_called()
    try:
        out = cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(driver_daemonset(name="e2e-warned")))
        assert "Warning: dra-guard would add a gRPC livenessProbe" in out.stderr
        assert "livenessProbe" not in get_ds(cp, "e2e-warned")["spec"]["template"]["spec"]["containers"][0]
    finally:
        cp.kubectl("admin", "delete", "daemonset", "-n", "gpu", "e2e-warned", "--ignore-not-found")
        guard.start(mode="enforce")
        guard.wait_called()
