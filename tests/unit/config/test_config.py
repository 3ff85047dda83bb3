"""Configuration: defaults, validation errors that name the key, never-trusted identities."""

from __future__ import annotations

import pytest

from webhook.config import ConfigError, from_mapping, load_config


def test_defaults():
    cfg = from_mapping(None)
    assert cfg.mode == "enforce"
    assert cfg.policy("rbac").mode == "enforce" and cfg.policy("rbac").failure_mode == "deny"
    assert cfg.rbac.admin_subjects.groups == {"system:masters"}
    assert cfg.rbac.protected_resources == {"deviceclasses", "devicetaintrules", "resourceslices"}
    assert cfg.server.port == 8443 and cfg.server.max_request_bytes == 8 * 1024 * 1024


def test_global_mode_is_the_policy_default():
    assert from_mapping({"mode": "audit"}).policy("rbac").mode == "audit"
    assert from_mapping({"mode": "audit", "policies": {"rbac": {"mode": "warn"}}}).policy("rbac").mode == "warn"


@pytest.mark.parametrize(
    "data, key",
    [
        ({"mode": "deny"}, "mode"),
        ({"policies": {"rbac": {"mode": "Enforce"}}}, "policies.rbac.mode"),
        ({"policies": {"rbac": {"failureMode": "ignore"}}}, "policies.rbac.failureMode"),
        ({"policies": {"nope": {}}}, "policies.nope"),
        ({"rbac": {"adminSubjects": {"groups": "system:masters"}}}, "rbac.adminSubjects.groups"),
        ({"rbac": {"adminSubjects": {"groups": [""]}}}, "rbac.adminSubjects.groups[0]"),
        ({"rbac": {"driverSubjects": {"serviceAccounts": ["no-colon"]}}}, "rbac.driverSubjects.serviceAccounts"),
        ({"rbac": {"driverSubject": {}}}, "rbac.driverSubject"),
        ({"server": {"port": 0}}, "server.port"),
        ({"server": {"port": "8443"}}, "server.port"),
        ({"server": {"threads": True}}, "server.threads"),
        ({"cluster": {"requestTimeoutSeconds": 60}}, "cluster.requestTimeoutSeconds"),
        ({"kind": "Pod"}, "kind"),
        (["not", "a", "mapping"], "<top level>"),
    ],
)
def test_invalid_values_name_the_key(data, key):
    with pytest.raises(ConfigError) as err:
        from_mapping(data)
    assert str(err.value).startswith(key + ":"), str(err.value)


def test_never_privileged_entries_are_reported_as_ignored():
    cfg = from_mapping({"rbac": {"adminSubjects": {"groups": ["system:authenticated", "ops"], "users": ["system:anonymous"]}}})
    assert any("system:authenticated" in line for line in cfg.ignored)
    assert any("system:anonymous" in line for line in cfg.ignored)
    assert not cfg.rbac.admin_subjects.contains(kind="Group", name="system:authenticated")
    assert cfg.rbac.admin_subjects.contains(kind="Group", name="ops")


def test_load_config_file_errors(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("mode: enforce\npolicies:\n  rbac: [unclosed\n")
    with pytest.raises(ConfigError, match=r"c.yaml line \d+: invalid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    good = tmp_path / "ok.yaml"
    good.write_text("apiVersion: dra-guard.io/v1alpha1\nkind: DraGuardConfiguration\nmode: warn\n")
    assert load_config(good).mode == "warn"


def test_documented_configuration_block_is_valid_and_equals_the_defaults():
    """The documented config (docs/configuration.md) must load, and it documents the defaults."""
    import pathlib
    import re

    import yaml

    readme = (pathlib.Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    block = re.search(r"^# Configuration.*?```yaml\n(.*?)```", readme, re.S | re.M).group(1)
    assert from_mapping(yaml.safe_load(block)) == from_mapping(None)


def test_config_module_docstring_example_equals_the_defaults():
    import yaml

    from webhook import config as config_mod

    text = config_mod.__doc__.split("Example (all defaults shown)::", 1)[1]
    block = "\n".join(line[4:] for line in text.splitlines() if line.startswith("    ") or not line.strip())
    assert from_mapping(yaml.safe_load(block)) == from_mapping(None)


def test_config_file_that_is_not_text_or_too_deep_names_the_file(tmp_path):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="bin.yaml: not UTF-8"):
        load_config(binary)
    deep = tmp_path / "deep.yaml"
    deep.write_text("mode: " + "[" * 5000)
    with pytest.raises(ConfigError, match="deep.yaml"):
        load_config(deep)


EXACT_MESSAGES = [
    ({"policies": {"rbac": {"mode": "x"}}}, "policies.rbac.mode: must be one of enforce, warn, audit; got 'x'"),
    ({"probes": {"periodSeconds": 0}}, "probes.periodSeconds: must be between 1 and 3600; got 0"),
    (
        {"probes": {"startupProbe": {"failureThreshold": 100001}}},
        "probes.startupProbe.failureThreshold: must be between 1 and 100000; got 100001",
    ),
    ({"probes": {"startupProbe": 3}}, "probes.startupProbe: expected a mapping, got int"),
    ({"server": {"port": "x"}}, "server.port: expected int, got str 'x'"),
    ({"server": {"threads": True}}, "server.threads: expected a number, got a boolean"),
    ({"audit": {"qps": "x"}}, "audit.qps: expected int or float, got str 'x'"),
    (
        {"rbac": {"driverSubject": {}}},
        "rbac.driverSubject: unknown key; did you mean 'driverSubjects'? (known here: adminOnlyResources, adminSubjects, "
        "aggregationControllerUsers, apiGroup, driftRemediation, driverResources, driverSubjects, escalationChecks, "
        "extraAdminSubjects, extraDriverSubjects, "
        "sensitiveNamespaces, writeVerbs)",
    ),
    (
        {"rbac": {"adminSubjects": {"serviceAccounts": ["a"]}}},
        "rbac.adminSubjects.serviceAccounts: 'a' must be 'namespace:name', 'namespace/name' or "
        "'system:serviceaccount:namespace:name' (name may be *)",
    ),
    (
        {"rbac": {"extraDriverSubjects": {"serviceAccounts": ["system:serviceaccount:gpu"]}}},
        "rbac.extraDriverSubjects.serviceAccounts: 'system:serviceaccount:gpu' must be 'namespace:name', "
        "'namespace/name' or 'system:serviceaccount:namespace:name' (name may be *)",
    ),
    ({"rbac": {"writeVerbs": [""]}}, "rbac.writeVerbs[0]: expected a non-empty string, got ''"),
    ({"drivers": {"selectors": [{}]}}, "drivers.selectors[0].namespace: required"),
    (
        {"drivers": {"selectors": [{"namespace": "n", "matchLabels": {"a": 1}}]}},
        "drivers.selectors[0].matchLabels: keys and values must be strings; got 'a': 1",
    ),
    ({"drivers": {"selectors": ["x"]}}, "drivers.selectors[0]: expected a mapping, got str"),
    ({"certificates": {"renewAfterShare": 1}}, "certificates.renewAfterShare: must be between 0.1 and 0.95; got 1"),
    ({"certificates": {"extraIpAddresses": ["x"]}}, "certificates.extraIpAddresses: 'x' is not an IP address"),
    (
        {"certificates": {"leafValidityDays": 3650}},
        "certificates.leafValidityDays: must be shorter than certificates.caValidityDays",
    ),
    ({"certificates": {"mode": "manual"}}, "certificates.mode: must be one of self, cert-manager, files; got 'manual'"),
    ({"audit": {"qps": 0}}, "audit.qps: must be > 0 and <= 1000; got 0"),
    ({"cluster": {"requestTimeoutSeconds": 60}}, "cluster.requestTimeoutSeconds: must be > 0 and <= 30; got 60"),
    ({"apiVersion": "v1"}, "apiVersion: must be one of dra-guard.io/v1alpha1; got 'v1'"),
    (
        {"bogus": 1},
        "bogus: unknown key (known here: apiVersion, audit, certificates, cluster, drivers, eviction, exceptions, "
        "kind, mode, policies, probes, rbac, server)",
    ),
    # the chart's schema always refused an empty apiGroup; the reader now does too
    ({"rbac": {"apiGroup": ""}}, "rbac.apiGroup: must not be empty"),
]


@pytest.mark.parametrize("data, message", EXACT_MESSAGES, ids=[m.split(":")[0] for _, m in EXACT_MESSAGES])
def test_error_messages(data, message):
    with pytest.raises(ConfigError) as err:
        from_mapping(data)
    assert str(err.value) == message


def test_values_are_stored_as_declared():
    cfg = from_mapping(
        {
            "certificates": {
                "extraIpAddresses": ["::1", "10.0.0.1", "10.0.0.1"],
                "extraDnsNames": ["b", "a"],
                "renewAfterShare": 0.5,
            },
            "audit": {"qps": 5},
            "cluster": {"requestTimeoutSeconds": 1},
            "rbac": {"adminSubjects": {"users": ["u"]}},
            "probes": {"startupProbe": {"enabled": True}},
            "policies": {"probes": {"failureMode": "deny"}},
            "mode": "warn",
        }
    )
    assert cfg.certificates.extra_ip_addresses == ("10.0.0.1", "::1") and cfg.certificates.extra_dns_names == ("a", "b")
    assert isinstance(cfg.audit.qps, float) and isinstance(cfg.cluster.request_timeout_seconds, float)
    # an unset key of a nested section keeps the enclosing default's value, not the section class's
    assert cfg.rbac.admin_subjects.groups == {"system:masters"} and cfg.rbac.admin_subjects.users == {"u"}
    assert cfg.probes.startup_probe and cfg.probes.startup_period_seconds == 10  # default 10 s x 30
    assert cfg.policy("probes").mode == "warn" and cfg.policy("probes").failure_mode == "deny"
    assert cfg.policy("eviction").failure_mode == "deny" and cfg.policy("rbac").failure_mode == "deny"


@pytest.mark.parametrize("engine", ["asyncio", "gthread"])
def test_a_config_still_carrying_server_engine_is_refused_naming_the_key(tmp_path, engine):
    """server.engine chose between two servers before the event-loop front became the only one; it
    was never released, so a file that still sets it is an unknown key, not a silently ignored one."""
    path = tmp_path / "config.yaml"
    path.write_text(f"server:\n  threads: 8\n  engine: {engine}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{path}: server.engine: unknown key" in str(err.value)


def test_serve_stops_at_start_up_on_server_engine(tmp_path, monkeypatch, capsys):
    """`dra-guard serve` exits 2 with the loader's one line naming server.engine, before gunicorn starts."""
    from webhook.cli import main
    from webhook.serve import server

    monkeypatch.setattr(server, "run", lambda options: pytest.fail("serve started with server.engine in its config"))
    path = tmp_path / "config.yaml"
    path.write_text("server:\n  engine: asyncio\n")
    assert main(["serve", "--config", str(path), "--no-cluster", "--self-signed", str(tmp_path / "tls")]) == 2
    err = capsys.readouterr().err
    assert "server.engine: unknown key" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "resources, bad",
    [
        (["resourceslices", "pods", "leases"], "leases, pods are not DRA resources of resource.k8s.io"),
        (["leases.coordination.k8s.io"], "leases.coordination.k8s.io is not a DRA resource of resource.k8s.io"),
        (["resourceclaims"], "resourceclaims is not a DRA resource"),  # not an admin kind: every claim writer would be flagged
        (["resourceslices.example.com"], "resourceslices.example.com is not a DRA resource"),
    ],
)
def test_driver_resources_are_dra_resources_only(resources, bad, tmp_path):
    """Every driver subject may write what rbac.driverResources lists, wherever it is bound: a core
    resource there (the advice an older message gave: pods, leases) handed every driver that write
    in every namespace, unreported. `config validate` refuses it naming the key and the entries."""
    with pytest.raises(ConfigError, match=r"^rbac\.driverResources: " + bad):
        from_mapping({"rbac": {"driverResources": resources}})
    import subprocess
    import sys

    (tmp_path / "c.yaml").write_text(f"rbac:\n  driverResources: {resources}\n".replace("'", ""))
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "config", "validate", str(tmp_path / "c.yaml")], capture_output=True, text=True
    )
    assert out.returncode == 2 and "rbac.driverResources: " + bad in out.stderr, out.stderr


def test_driver_resources_may_be_group_qualified():
    config = from_mapping({"rbac": {"driverResources": ["resourceslices.resource.k8s.io", "devicetaintrules"]}})
    assert config.rbac.driver_resources == {"resourceslices", "devicetaintrules"}
