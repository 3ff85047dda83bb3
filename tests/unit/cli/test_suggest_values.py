"""`dra-guard audit --suggest-values`: the Helm values that clear the driver findings, and only
those, keeping the entries already configured (a values file replaces a list)."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import yaml

from webhook.cli import main

DAEMONSET = pathlib.Path(__file__).resolve().parents[3] / "examples" / "non-compliant" / "driver-daemonset.yaml"


def _binding(name: str, role: str, subject: dict[str, str], *, namespace: str = "") -> list[dict[str, Any]]:
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject],
        }
    ]


def _role(name: str, resources: list[str], group: str = "resource.k8s.io") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": [group], "resources": resources, "verbs": ["create", "update", "delete"]}],
    }


def _sa(namespace: str, name: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "namespace": namespace, "name": name}


OBJECTS = [
    _role("slices", ["resourceslices"]),
    _role("classes", ["deviceclasses", "resourceslices"]),
    _role("pods", ["pods"], group=""),
    # the driver's ServiceAccount writes ResourceSlices: a driver subject clears it
    *_binding("driver-slices", "slices", _sa("dra-example-driver", "dra-example-driver-service-account")),
    # a second driver: slices cluster-wide and its own pods through a RoleBinding in its namespace
    *_binding("other-slices", "slices", _sa("gpu", "gpu-driver")),
    *_binding("other-pods", "pods", _sa("gpu", "gpu-driver"), namespace="gpu"),
    # not a driver's: DeviceClasses are admin-only, a group is nobody's driver, and a ServiceAccount
    # with powers in kube-system besides its slices is for an admin to judge
    *_binding("ci-classes", "classes", _sa("ci", "deployer")),
    *_binding("team-slices", "slices", {"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}),
    *_binding("sys-pods", "pods", _sa("tools", "runner"), namespace="kube-system"),
    *_binding("tools-slices", "slices", _sa("tools", "runner")),
]


def _audit(capsys, tmp_path: pathlib.Path, config: dict[str, Any] | None, *extra: str) -> tuple[int, str, str]:
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all(OBJECTS) + "---\n" + DAEMONSET.read_text())
    args = ["audit", "-q", "-f", str(tmp_path / "objects.yaml"), *extra]
    if config is not None:
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
        args += ["--config", str(tmp_path / "config.yaml")]
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _helm_merge(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`helm -f`: maps merge key by key, anything else (lists) replaces."""
    out = copy.deepcopy(base)
    for k, v in values.items():
        out[k] = _helm_merge(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


def test_the_suggested_values_clear_every_driver_finding_and_nothing_else(tmp_path, capsys):
    before = {
        "rbac": {"extraDriverSubjects": {"serviceAccounts": ["old:driver"]}},
        "drivers": {"declared": [{"namespace": "old", "name": "old-driver"}]},
    }
    code, out, _ = _audit(capsys, tmp_path, before, "--suggest-values")
    assert code == 1  # the audit's exit code: the findings still stand
    values = yaml.safe_load(out)
    assert values == {
        "config": {
            "rbac": {
                "extraDriverSubjects": {
                    "serviceAccounts": ["dra-example-driver:dra-example-driver-service-account", "gpu:gpu-driver", "old:driver"]
                }
            },
            "drivers": {
                "declared": [
                    {"namespace": "old", "name": "old-driver"},
                    {"namespace": "dra-example-driver", "name": "gpu-example-driver"},
                ]
            },
        }
    }
    assert (
        "# Safe: driver subjects may write only resourceslices (rbac.driverResources), never "
        "deviceclasses, devicetaintrules" in out
    )
    assert "# Safe: a declared driver only has its pods' evictions fail closed" in out

    after = _helm_merge(before, values["config"])
    code, out, _ = _audit(capsys, tmp_path, after, "-o", "json")
    findings = yaml.safe_load(out)["findings"]
    left = sorted((f["check"], f["name"]) for f in findings if f["check"] in ("rbac-write", "undeclared-driver"))
    # what remains needs an admin: DeviceClasses, a group, powers in kube-system (and its slices with them)
    assert left == [
        ("rbac-write", "ci-classes"),
        ("rbac-write", "sys-pods"),
        ("rbac-write", "team-slices"),
        ("rbac-write", "tools-slices"),
    ]


def test_nothing_to_suggest_is_an_empty_config(tmp_path, capsys):
    config = {
        "rbac": {
            "driverSubjects": {"serviceAccounts": ["dra-example-driver:dra-example-driver-service-account", "gpu:gpu-driver"]}
        },
        "drivers": {"declared": [{"namespace": "dra-example-driver", "name": "gpu-example-driver"}]},
    }
    code, out, _ = _audit(capsys, tmp_path, config, "--suggest-values")
    assert code == 1 and yaml.safe_load(out) == {"config": {}} and "nothing to add" in out


def test_suggest_values_is_yaml_only(tmp_path, capsys):
    code, out, err = _audit(capsys, tmp_path, None, "--suggest-values", "-o", "json")
    assert code == 2 and out == "" and "--suggest-values" in err
