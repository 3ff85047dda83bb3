"""Configuration: defaults, validation errors that name the key, never-trusted identities."""
from __future__ import annotations

import pytest

from webhook.config import ConfigError, from_mapping, load_config


def test_defaults():
    cfg = from_mapping(None)
    assert cfg.mode == "enforce"
    assert cfg.policy("rbac").mode == "enforce" and cfg.policy("rbac").failure_mode == "deny"
    assert cfg.rbac.admin_subjects.groups == {"system:masters"}
    assert cfg.rbac.protected_resources == {"deviceclasses", "resourceslices"}
    assert cfg.server.port == 8443 and cfg.server.max_request_bytes == 8 * 1024 * 1024


def test_global_mode_is_the_policy_default():
    assert from_mapping({"mode": "audit"}).policy("rbac").mode == "audit"
    assert from_mapping({"mode": "audit", "policies": {"rbac": {"mode": "warn"}}}).policy("rbac").mode == "warn"


@pytest.mark.parametrize("data, key", [
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
])
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


def test_readme_configuration_block_is_valid_and_equals_the_defaults():
    """The documented config (README "Configuration") must load, and it documents the defaults."""
    import pathlib
    import re

    import yaml

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"## Configuration.*?```yaml\n(.*?)```", readme, re.S).group(1)
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
