"""Driver detection and the liveness-probe mutation as pure functions."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from tests.builders import driver_daemonset, plugin_container
from webhook.config import from_mapping
from webhook.model import drivers
from webhook.policies import probes

CONFIG = from_mapping(None)


def request(obj, *, operation="CREATE", old=None):
    return {
        "uid": "u",
        "operation": operation,
        "object": obj,
        "oldObject": old,
        "kind": {"group": "apps", "version": "v1", "kind": "DaemonSet"},
    }


def decide(obj, config=CONFIG, **kw):
    return probes.review(
        request(obj, **kw),
        detection=config.detection,
        config=config.probes,
        can_write_slices=kw.pop("can_write", lambda ns, sa: False),
    )


def apply(obj, decision):
    return jsonpatch.apply_patch(obj, list(decision.patch))


# ------------------------------------------------------------------ detection
def test_dra_driver_is_detected_with_name_from_plugin_dir():
    d = drivers.detect(driver_daemonset(), config=CONFIG.detection)
    assert d is not None and d.name == "gpu.example.com" and d.plugin_containers == (0,)


def test_csi_node_plugin_is_not_a_driver():
    csi = driver_daemonset(cdi=False, plugin_subdir="csi.example.com")
    assert drivers.detect(csi, config=CONFIG.detection) is None


def test_service_account_that_writes_slices_is_a_dra_sign():
    ds = driver_daemonset(cdi=False)
    d = drivers.detect(ds, config=CONFIG.detection, can_write_slices=lambda ns, sa: (ns, sa) == ("gpu", "gpu-driver"))
    assert d is not None and "ResourceSlices" in d.evidence


def test_explicit_annotation_wins_and_auto_detection_can_be_off():
    cfg = from_mapping({"drivers": {"autoDetect": False}})
    assert drivers.detect(driver_daemonset(), config=cfg.detection) is None
    ds = driver_daemonset(cdi=False, annotations={drivers.DRIVER_KEY: "net.example.com"})
    d = drivers.detect(ds, config=cfg.detection)
    assert d is not None and d.name == "net.example.com"


def test_configured_selector():
    cfg = from_mapping(
        {
            "drivers": {
                "autoDetect": False,
                "selectors": [{"namespace": "gpu", "matchLabels": {"team": "x"}, "driverName": "d.example.com"}],
            }
        }
    )
    assert drivers.detect(driver_daemonset(labels={"team": "x"}), config=cfg.detection).name == "d.example.com"
    assert drivers.detect(driver_daemonset(labels={"team": "y"}), config=cfg.detection) is None


@pytest.mark.parametrize(
    "container, expected",
    [
        ({"args": ["--driver-name=a.example.com"]}, "a.example.com"),
        ({"args": ["--driver-name", "b.example.com"]}, "b.example.com"),
        ({"command": ["plugin", "-driver-name=c.example.com"]}, "c.example.com"),
        ({"env": [{"name": "DRIVER_NAME", "value": "d.example.com"}]}, "d.example.com"),
        ({"args": ["--other"]}, ""),
    ],
)
def test_driver_name_from_container(container, expected):
    assert drivers.name_from_container(container) == expected


# ------------------------------------------------------------------ acceptance 1: one add, idempotent
def test_probe_is_added_and_patch_is_idempotent():
    ds = driver_daemonset()
    d = decide(ds)
    probe_ops = [op for op in d.patch if op["path"] == "/spec/template/spec/containers/0/livenessProbe"]
    assert len(probe_ops) == 1 and probe_ops[0]["op"] == "add"
    assert probe_ops[0]["value"] == {
        "grpc": {"port": 51515, "service": "liveness"},
        "periodSeconds": 10,
        "timeoutSeconds": 10,
        "failureThreshold": 3,
    }
    assert all(op["op"] == "add" for op in d.patch)
    patched = apply(ds, d)
    again = decide(patched)
    assert again.patch == ()


# ------------------------------------------------------------------ acceptance 2: existing probe untouched
def test_container_with_exec_probe_is_left_alone():
    ds = driver_daemonset(
        containers=[
            plugin_container("a", args=["--healthcheck-port=51515"], livenessProbe={"exec": {"command": ["true"]}}),
            plugin_container("b", env=[{"name": "HEALTHCHECK_PORT", "value": "51516"}]),
        ]
    )
    d = decide(ds)
    paths = {op["path"] for op in d.patch}
    assert "/spec/template/spec/containers/1/livenessProbe" in paths
    assert not any(p.startswith("/spec/template/spec/containers/0") for p in paths)
    assert apply(ds, d)["spec"]["template"]["spec"]["containers"][1]["livenessProbe"]["grpc"]["port"] == 51516


def test_each_plugin_container_gets_its_own_port():
    ds = driver_daemonset(
        containers=[
            plugin_container("gpus", args=["--healthcheck-port", "51515"]),
            plugin_container("cd", ports=[{"name": "healthcheck", "containerPort": 51516}]),
            plugin_container("sidecar", mounts=()),
        ]
    )
    out = apply(ds, decide(ds))["spec"]["template"]["spec"]["containers"]
    assert [c.get("livenessProbe", {}).get("grpc", {}).get("port") for c in out] == [51515, 51516, None]


# ------------------------------------------------------------------ acceptance 3: CSI untouched, no port -> warning
def test_csi_plugin_daemonset_is_untouched():
    d = decide(driver_daemonset(cdi=False, plugin_subdir="csi.example.com"))
    assert d.patch == () and d.findings == ()


def test_driver_without_declared_port_gets_no_patch_but_a_finding():
    ds = driver_daemonset(containers=[plugin_container("plugin")])
    d = decide(ds)
    assert d.patch == ()
    assert d.allowed
    assert [f.check for f in d.findings] == ["no-healthcheck-port"]
    assert probes.PORT_ANNOTATION in d.findings[0].message


def test_assume_default_port():
    cfg = from_mapping({"probes": {"assumeDefaultPort": True, "defaultPort": 9000}})
    d = decide(driver_daemonset(containers=[plugin_container("plugin")]), config=cfg)
    assert d.patch and any(op.get("value", {}).get("grpc", {}).get("port") == 9000 for op in d.patch)


@pytest.mark.parametrize("annotation, ports", [("6000", [6000, 6000]), ("a=7001,b=7002", [7001, 7002])])
def test_port_annotation(annotation, ports):
    ds = driver_daemonset(
        containers=[plugin_container("a"), plugin_container("b")], annotations={probes.PORT_ANNOTATION: annotation}
    )
    out = apply(ds, decide(ds))["spec"]["template"]["spec"]["containers"]
    assert [c["livenessProbe"]["grpc"]["port"] for c in out] == ports


# ------------------------------------------------------------------ acceptance 4: escaping, no annotations
def test_annotations_with_slash_and_tilde_round_trip():
    ann = {"example.com/a~b": "1", "x/y/z": "2"}
    ds = driver_daemonset(annotations=dict(ann))
    patched = apply(copy.deepcopy(ds), decide(ds))
    assert {k: v for k, v in patched["metadata"]["annotations"].items() if not k.startswith(probes.ADDED_PREFIX)} == ann
    assert patched["metadata"]["annotations"][probes.ADDED_PREFIX + "plugin"] == "grpc:51515"
    assert any("~1" in op["path"] for op in decide(ds).patch)  # the new key's "/" is escaped


def test_daemonset_without_annotations_gets_the_map_created():
    ds = driver_daemonset()
    assert "annotations" not in ds["metadata"]
    patched = apply(ds, decide(ds))
    assert patched["metadata"]["annotations"] == {probes.ADDED_PREFIX + "plugin": "grpc:51515"}


# ------------------------------------------------------------------ opt-out, update, upgrade strategy, startup
def test_opt_out_annotation():
    assert decide(driver_daemonset(annotations={probes.OPT_OUT: "off"})).patch == ()


def test_update_with_unchanged_template_warns_instead_of_patching():
    ds = driver_daemonset()
    changed = copy.deepcopy(ds)
    changed["metadata"]["labels"] = {"new": "label"}
    d = decide(changed, operation="UPDATE", old=ds)
    assert d.patch == ()
    assert [f.check for f in d.findings] == ["missing-liveness-probe"] and not d.findings[0].fixed_by_patch


def test_update_with_template_change_patches():
    ds = driver_daemonset()
    changed = copy.deepcopy(ds)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example/driver:v2"
    assert decide(changed, operation="UPDATE", old=ds).patch


def test_startup_probe_by_default_with_a_budget_of_minutes():
    """A startupProbe on the same gRPC endpoint comes by default, 10 s x 30 = 5 min
    (device discovery can take minutes), then the liveness probe; configurable, and can be off."""
    out = apply(driver_daemonset(), decide(driver_daemonset()))["spec"]["template"]["spec"]["containers"][0]
    assert out["startupProbe"] == {"grpc": {"port": 51515, "service": "liveness"}, "periodSeconds": 10, "failureThreshold": 30}
    assert out["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    cfg = from_mapping({"probes": {"startupProbe": {"periodSeconds": 1, "failureThreshold": 600}}})
    out = apply(driver_daemonset(), decide(driver_daemonset(), config=cfg))["spec"]["template"]["spec"]["containers"][0]
    assert out["startupProbe"] == {"grpc": {"port": 51515, "service": "liveness"}, "periodSeconds": 1, "failureThreshold": 600}
    off = from_mapping({"probes": {"startupProbe": {"enabled": False}}})
    out = apply(driver_daemonset(), decide(driver_daemonset(), config=off))["spec"]["template"]["spec"]["containers"][0]
    assert "startupProbe" not in out and "livenessProbe" in out


def test_an_existing_startup_probe_is_kept():
    c = plugin_container(
        "plugin", args=["--healthcheck-port=51515"], startupProbe={"exec": {"command": ["true"]}, "failureThreshold": 90}
    )
    ds = driver_daemonset(containers=[c])
    out = apply(ds, decide(ds))["spec"]["template"]["spec"]["containers"][0]
    assert out["startupProbe"] == {"exec": {"command": ["true"]}, "failureThreshold": 90}
    assert out["livenessProbe"]["grpc"]["port"] == 51515


SEAMLESS_ENV = [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]


@pytest.mark.parametrize(
    "env, strategy, expected",
    [
        (SEAMLESS_ENV, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}, "maxSurge: 1"),
        (SEAMLESS_ENV, None, "maxSurge: 1"),  # the default maxSurge is 0
        (SEAMLESS_ENV, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}, None),
        (None, {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "10%", "maxUnavailable": 0}}, "fight over one"),
        (None, {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}}, None),
        (None, {"type": "OnDelete"}, None),
    ],
)
def test_seamless_upgrade_findings(env, strategy, expected):
    ds = driver_daemonset(containers=[plugin_container("plugin", args=["--healthcheck-port=51515"], env=env)], strategy=strategy)
    found = [f for f in decide(ds).findings if f.check == "seamless-upgrade"]
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0].message and not found[0].enforced


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "DaemonSet"},
        {"kind": "DaemonSet", "spec": {"template": {"spec": {"containers": "nope", "volumes": [None, 3]}}}},
        {
            "kind": "DaemonSet",
            "metadata": {"annotations": {drivers.DRIVER_KEY: "x"}},
            "spec": {"template": {"spec": {"containers": [None]}}},
        },
    ],
)
def test_malformed_daemonsets_do_not_crash(obj):
    assert decide(obj).allowed


# ------------------------------------------------------------------ regressions found by adversarial testing
def test_second_driver_container_added_on_update_gets_an_add_only_patch():
    first = apply(driver_daemonset(), decide(driver_daemonset()))
    changed = copy.deepcopy(first)
    changed["spec"]["template"]["spec"]["containers"].append(plugin_container("plugin2", args=["--healthcheck-port=51516"]))
    d = decide(changed, operation="UPDATE", old=first)
    assert d.patch and all(op["op"] == "add" for op in d.patch)
    out = apply(changed, d)
    assert out["spec"]["template"]["spec"]["containers"][1]["livenessProbe"]["grpc"]["port"] == 51516
    assert out["metadata"]["annotations"][probes.ADDED_PREFIX + "plugin"] == "grpc:51515"


@pytest.mark.parametrize("name", [5, None, {"a": 1}, ["a"]])
def test_container_names_of_any_type(name):
    ds = driver_daemonset(
        containers=[plugin_container("x", args=["--healthcheck-port=51515"])],
        annotations={drivers.CONTAINERS_ANNOTATION: "plugin"},
    )
    ds["spec"]["template"]["spec"]["containers"][0]["name"] = name
    assert decide(ds).allowed
    ds["metadata"].pop("annotations")
    d = decide(ds)
    assert d.patch and all(op["op"] == "add" for op in d.patch)


@pytest.mark.parametrize("metadata", [None, "x", {"annotations": None}])
def test_odd_metadata(metadata):
    ds = driver_daemonset()
    ds["metadata"] = metadata
    d = decide(ds)
    assert d.allowed
    if d.patch:
        apply(ds, d)


def test_deeply_nested_daemonset_is_not_deep_copied():
    ds = driver_daemonset()
    deep: list = []
    cur = deep
    for _ in range(900):
        cur.append([])
        cur = cur[0]
    ds["spec"]["x"] = deep
    d = decide(ds)
    assert d.patch and not any(op["path"].startswith("/spec/x") for op in d.patch)


@pytest.mark.parametrize("annotations", [None, {}, {"team": "gpu", "a/b": "c"}])
@pytest.mark.parametrize("extra_containers", [0, 2])
def test_patch_of_the_changed_subtrees_equals_the_whole_object_diff(annotations, extra_containers):
    """_patch diffs only metadata and containers: it must give what diffing the
    whole DaemonSet gives, and applying it must give the modified object."""
    containers = [plugin_container("sidecar", mounts=())] * extra_containers
    containers.insert(1 if extra_containers else 0, plugin_container("plugin", args=["--healthcheck-port=51515"]))
    ds = driver_daemonset(annotations=annotations, containers=[copy.deepcopy(c) for c in containers])
    driver = drivers.detect(ds, config=CONFIG.detection)
    modified, _ = probes.evaluate(ds, driver=driver, config=CONFIG.probes)
    ops = probes._patch(ds, modified)
    assert ops and all(op["op"] == "add" for op in ops)
    assert sorted(map(str, ops)) == sorted(map(str, jsonpatch.make_patch(ds, modified).patch))
    assert jsonpatch.apply_patch(ds, list(ops)) == modified
