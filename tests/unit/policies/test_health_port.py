"""The health port per driver: probes.assumeDefaultPort per drivers.selectors entry (unset: the
global value), and never on a driver known to switch its health service off by leaving the port
out (the SR-IOV DRA driver)."""

from __future__ import annotations

import pytest

from tests.builders import driver_daemonset, plugin_container
from tests.drivers_catalogue import sriov_driver
from webhook.config import ConfigError, from_mapping
from webhook.model import health
from webhook.policies import probes


def probed_ports(daemonset, config):
    """{container name: port} of the liveness probes the patch adds, and the decision."""
    decision = probes.review({"operation": "CREATE", "object": daemonset}, detection=config.detection, config=config.probes)
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    ports = {
        containers[int(op["path"].split("/")[-2])]["name"]: op["value"]["grpc"]["port"]
        for op in decision.patch
        if op["path"].endswith("/livenessProbe")
    }
    return ports, decision


def test_the_sriov_driver_gets_no_assumed_port_and_a_warning_saying_why():
    sriov = sriov_driver()
    config = from_mapping(
        {"probes": {"assumeDefaultPort": True}, "rbac": {"driverSubjects": {"serviceAccounts": [sriov.service_account]}}}
    )
    ports, decision = probed_ports(sriov.daemonset, config)
    assert ports == {} and decision.patch == ()
    [f] = [f for f in decision.findings if f.check == "healthcheck-disabled"]
    assert not f.enforced and not f.fixed_by_patch
    assert "HEALTHCHECK_PORT unset" in f.message and "SR-IOV DRA driver" in f.message
    assert "probes.assumeDefaultPort is never applied" in f.message
    assert "HEALTHCHECK_PORT unset" in f.summary
    audited = probes.audit(sriov.daemonset, detection=config.detection, config=config.probes)
    assert [a.check for a in audited] == ["healthcheck-disabled"]


def test_the_sriov_driver_with_a_declared_port_is_probed():
    """What the driver says wins: with HEALTHCHECK_PORT set its health service is on."""
    sriov = sriov_driver()
    ds = sriov.daemonset
    ds["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "HEALTHCHECK_PORT", "value": "51599"})
    config = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": [sriov.service_account]}}})
    assert probed_ports(ds, config)[0] == {"plugin": 51599}


@pytest.mark.parametrize(
    "image, name",
    [
        ("ghcr.io/k8snetworkplumbingwg/dra-driver-sriov:v0.1.0", "dra-driver-sriov"),  # the chart README's image.repository
        ("quay.io/schseba/dra-driver-sriov:latest", "dra-driver-sriov"),  # the chart values.yaml's (older) default
        ("mirror.local:5000/dra-driver-sriov@sha256:abc", "dra-driver-sriov"),
        ("dra-driver-sriov", "dra-driver-sriov"),
        ("registry.example/dra-driver-sriov-operator:v1", "dra-driver-sriov-operator"),
    ],
)
def test_image_name(image, name):
    assert health.image_name(image) == name


def _gpu(labels):
    return driver_daemonset(containers=[plugin_container("plugin")], labels=labels)


@pytest.mark.parametrize(
    "global_on, selector, expected",
    [
        (True, {"assumeDefaultPort": False}, {}),
        (False, {"assumeDefaultPort": True}, {"plugin": 9000}),
        (True, {}, {"plugin": 9000}),  # unset: the global value
        (False, {}, {}),
    ],
)
def test_a_selector_overrides_the_global_assume_default_port(global_on, selector, expected):
    config = from_mapping(
        {
            "probes": {"assumeDefaultPort": global_on, "defaultPort": 9000},
            "drivers": {"selectors": [{"namespace": "gpu", "matchLabels": {"app": "gpu-driver"}, **selector}]},
        }
    )
    ports, decision = probed_ports(_gpu({"app": "gpu-driver"}), config)
    assert ports == expected
    if not expected:
        assert [f.check for f in decision.findings] == ["no-healthcheck-port"]
    # a DaemonSet the selector does not match keeps the global value
    assert probed_ports(_gpu({"app": "other"}), config)[0] == ({"plugin": 9000} if global_on else {})


def test_a_selector_setting_must_be_a_boolean():
    with pytest.raises(ConfigError, match=r"^drivers\.selectors\[0\]\.assumeDefaultPort: expected bool"):
        from_mapping({"drivers": {"selectors": [{"namespace": "gpu", "assumeDefaultPort": "yes"}]}})
