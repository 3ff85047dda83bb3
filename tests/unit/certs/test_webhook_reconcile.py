"""certificates.mode self keeps its webhook configurations whole (docs/threat-model.md, path 5): the
comparison with the chart's webhooks (certs.webhookspec) and the Reconciler's restore, over an
in-memory CertApi (pure logic). The apiserver's defaults are checked against the real apiserver in
tests/e2e/test_certificates.py."""

from __future__ import annotations

import base64
import copy
import json

import pytest

from certs import webhookspec
from certs.ports import Conflict
from certs.selfmanaged import Reconciler
from tests.unit.certs.test_selfmanaged_certs import Clock, FakeCertApi
from webhook.config import from_mapping

RBAC_HOOK = {
    "name": "rbac.dra-guard.io",
    "admissionReviewVersions": ["v1"],
    "sideEffects": "None",
    "failurePolicy": "Fail",
    "timeoutSeconds": 3,
    "clientConfig": {"service": {"name": "dra-guard", "namespace": "dra-guard", "path": "/validate/rbac"}},
    "rules": [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["clusterroles", "clusterrolebindings"],
        }
    ],
    "matchConditions": [{"name": "not-control-plane", "expression": "request.userInfo.username != 'system:apiserver'"}],
}
PROBE_HOOK = {
    "name": "probes.dra-guard.io",
    "admissionReviewVersions": ["v1"],
    "sideEffects": "None",
    "failurePolicy": "Ignore",
    "clientConfig": {"service": {"name": "dra-guard", "namespace": "dra-guard", "path": "/mutate/daemonsets"}},
    "rules": [
        {
            "apiGroups": ["apps"],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["daemonsets"],
            "scope": "Namespaced",
        }
    ],
}
DESIRED = {"validating": [RBAC_HOOK], "mutating": [PROBE_HOOK]}


def as_stored(hook, kind):
    """What the apiserver stores for `hook`: its defaults filled in (admissionregistration.k8s.io/v1)."""
    out = copy.deepcopy(hook)
    out.setdefault("matchPolicy", "Equivalent")
    out.setdefault("namespaceSelector", {})
    out.setdefault("objectSelector", {})
    out.setdefault("timeoutSeconds", 10)
    out["clientConfig"]["service"].setdefault("port", 443)
    for rule in out["rules"]:
        rule.setdefault("scope", "*")
    if kind == "mutating":
        out.setdefault("reinvocationPolicy", "Never")
    return out


class WholeConfigApi(FakeCertApi):
    """FakeCertApi whose webhook configurations are whole objects with a resourceVersion."""

    def __init__(self, desired=DESIRED):
        super().__init__()
        self.config_maps = {"dra-guard": {"webhooks.json": json.dumps(desired)}}
        self.configs = {
            (k, "dra-guard"): {
                "metadata": {"name": "dra-guard", "resourceVersion": "1"},
                "webhooks": [as_stored(h, k) for h in desired[k]],
            }
            for k in ("validating", "mutating")
        }
        self.race_on_replace = False

    def get_config_map(self, name):
        return copy.deepcopy(self.config_maps.get(name))

    def webhook_configuration(self, kind, name):
        return copy.deepcopy(self.configs.get((kind, name)))

    def replace_webhooks(self, kind, name, webhooks, resource_version):
        config = self.configs[(kind, name)]
        if self.race_on_replace or config["metadata"]["resourceVersion"] != resource_version:
            raise Conflict("changed")
        config["webhooks"] = [as_stored(h, kind) for h in webhooks]
        config["metadata"]["resourceVersion"] = self._next()
        self.writes.append(("webhooks", kind))

    def webhook_ca_bundles(self, kind, name):
        config = self.configs.get((kind, name))
        if config is None:
            return None
        return [base64.b64decode(h["clientConfig"].get("caBundle", "")) for h in config["webhooks"]]

    def set_webhook_ca_bundles(self, kind, name, bundle):
        for h in self.configs[(kind, name)]["webhooks"]:
            h["clientConfig"]["caBundle"] = base64.b64encode(bundle).decode()
        self.writes.append(("caBundle", kind))

    def tamper(self, kind, change):
        config = self.configs[(kind, "dra-guard")]
        change(config["webhooks"])
        config["metadata"]["resourceVersion"] = self._next()


def reconciler(api, tmp_path, name="a", config_map="dra-guard"):
    cfg = from_mapping(
        {"certificates": {"mode": "self", "namespace": "dra-guard", "dir": str(tmp_path / name), "webhooksConfigMap": config_map}}
    ).certificates
    rec = Reconciler(api, cfg, identity=name, now=Clock())
    rec.seen = []
    rec.on_drift = lambda kind, cname, diffs, restored: rec.seen.append((kind, diffs, restored))
    return rec


def drifted(rec):
    return [(kind, diffs, restored) for kind, diffs, restored in rec.seen if diffs]


# ------------------------------------------------------------------ the comparison


def test_a_stored_configuration_with_the_apiservers_defaults_is_no_drift():
    for kind, hooks in DESIRED.items():
        stored = [as_stored(h, kind) for h in hooks]
        stored[0]["clientConfig"]["caBundle"] = "Zm9v"
        assert webhookspec.drift(stored, hooks, kind) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda hooks: hooks[0]["matchConditions"].append(
                {"name": "skip-me", "expression": "request.userInfo.username != 'mallory'"}
            ),
            "rbac.dra-guard.io: matchConditions differ",
        ),
        (lambda hooks: hooks[0].update(failurePolicy="Ignore"), "rbac.dra-guard.io: failurePolicy differ"),
        (
            lambda hooks: hooks[0].update(namespaceSelector={"matchLabels": {"x": "y"}}),
            "rbac.dra-guard.io: namespaceSelector differ",
        ),
        (lambda hooks: hooks[0].update(objectSelector={"matchLabels": {"x": "y"}}), "rbac.dra-guard.io: objectSelector differ"),
        (lambda hooks: hooks[0]["rules"][0]["resources"].remove("clusterroles"), "rbac.dra-guard.io: rules differ"),
        (
            lambda hooks: hooks[0]["clientConfig"].update(url="https://elsewhere.example/validate"),
            "rbac.dra-guard.io: clientConfig differ",
        ),
        (lambda hooks: hooks[0].pop("matchConditions"), "rbac.dra-guard.io: matchConditions differ"),
        (lambda hooks: hooks.clear(), "missing webhook rbac.dra-guard.io"),
        (lambda hooks: hooks.append({**copy.deepcopy(hooks[0]), "name": "extra.example.com"}), "extra webhook extra.example.com"),
    ],
)
def test_every_way_around_the_rbac_webhook_is_a_difference(change, expected):
    stored = [as_stored(RBAC_HOOK, "validating")]
    change(stored)
    assert expected in webhookspec.drift(stored, [RBAC_HOOK], "validating")


def test_a_changed_caBundle_alone_is_not_drift():
    stored = [as_stored(RBAC_HOOK, "validating")]
    stored[0]["clientConfig"]["caBundle"] = "b3RoZXI="
    assert webhookspec.drift(stored, [RBAC_HOOK], "validating") == []


def test_a_mutating_webhook_reinvoked_is_a_difference():
    stored = [as_stored(PROBE_HOOK, "mutating")]
    stored[0]["reinvocationPolicy"] = "IfNeeded"
    assert webhookspec.drift(stored, [PROBE_HOOK], "mutating") == ["probes.dra-guard.io: reinvocationPolicy differ"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[]", "must be an object"),
        ('{"validating": {}}', "validating must be a list"),
        ('{"validating": [{"rules": []}]}', "validating[0] must be a webhook object with a name"),
        ('{"validating": [{"name": "a"}, {"name": "a"}]}', "two webhooks named 'a'"),
        ('{"validatin": []}', "unknown keys ['validatin']"),
    ],
)
def test_a_malformed_webhooks_json_is_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        webhookspec.parse_desired(text)


# ------------------------------------------------------------------ the Reconciler


def test_an_added_match_condition_is_reported_and_restored_with_the_ca_bundle(tmp_path):
    api = WholeConfigApi()
    rec = reconciler(api, tmp_path)
    rec.reconcile()
    assert drifted(rec) == []
    api.tamper(
        "validating",
        lambda hooks: hooks[0]["matchConditions"].append(
            {"name": "skip-mallory", "expression": "request.userInfo.username != 'mallory'"}
        ),
    )
    rec.reconcile()
    assert drifted(rec) == [("validating", ["rbac.dra-guard.io: matchConditions differ"], True)]
    live = api.configs[("validating", "dra-guard")]["webhooks"]
    assert [c["name"] for c in live[0]["matchConditions"]] == ["not-control-plane"]
    want = api.secrets["dra-guard-tls"]["data"]["ca-bundle.crt"]
    assert api.webhook_ca_bundles("validating", "dra-guard") == [want]
    rec.seen.clear()
    rec.reconcile()
    assert drifted(rec) == [] and rec.seen  # checked again, clean


def test_only_the_lease_holder_restores_every_replica_reports(tmp_path):
    api = WholeConfigApi()
    a, b = reconciler(api, tmp_path, "a"), reconciler(api, tmp_path, "b")
    a.reconcile()  # a holds the Lease
    api.tamper("validating", lambda hooks: hooks[0].update(failurePolicy="Ignore"))
    b.reconcile()
    assert drifted(b) == [("validating", ["rbac.dra-guard.io: failurePolicy differ"], False)]
    assert api.configs[("validating", "dra-guard")]["webhooks"][0]["failurePolicy"] == "Ignore"
    a.reconcile()
    assert drifted(a)[-1] == ("validating", ["rbac.dra-guard.io: failurePolicy differ"], True)
    assert api.configs[("validating", "dra-guard")]["webhooks"][0]["failurePolicy"] == "Fail"


def test_a_concurrent_change_is_not_overwritten_and_is_retried_next_round(tmp_path):
    api = WholeConfigApi()
    rec = reconciler(api, tmp_path)
    rec.reconcile()
    api.tamper("validating", lambda hooks: hooks[0].update(timeoutSeconds=30))
    api.race_on_replace = True
    rec.reconcile()
    assert drifted(rec)[-1] == ("validating", ["rbac.dra-guard.io: timeoutSeconds differ"], False)
    api.race_on_replace = False
    rec.reconcile()
    assert api.configs[("validating", "dra-guard")]["webhooks"][0]["timeoutSeconds"] == 3


def test_an_upgrade_moves_the_desired_webhooks_without_a_restart(tmp_path):
    api = WholeConfigApi()
    rec = reconciler(api, tmp_path)
    rec.reconcile()
    upgraded = copy.deepcopy(DESIRED)
    upgraded["validating"][0]["timeoutSeconds"] = 5
    api.config_maps["dra-guard"]["webhooks.json"] = json.dumps(upgraded)  # helm upgrade: ConfigMap first
    api.tamper("validating", lambda hooks: hooks[0].update(timeoutSeconds=5))  # then the configuration
    rec.reconcile()
    assert drifted(rec) == [] and api.configs[("validating", "dra-guard")]["webhooks"][0]["timeoutSeconds"] == 5


def test_a_deleted_configuration_stays_deleted(tmp_path):
    api = WholeConfigApi()
    rec = reconciler(api, tmp_path)
    rec.reconcile()
    del api.configs[("validating", "dra-guard")]  # the break-glass
    rec.reconcile()
    assert ("validating", "dra-guard") not in api.configs
    assert ("webhooks", "validating") not in api.writes


def test_without_the_config_map_only_the_ca_bundle_is_kept(tmp_path):
    api = WholeConfigApi()
    rec = reconciler(api, tmp_path, config_map="")
    rec.reconcile()
    api.tamper("validating", lambda hooks: hooks[0].update(failurePolicy="Ignore"))
    rec.reconcile()
    assert rec.seen == [] and api.configs[("validating", "dra-guard")]["webhooks"][0]["failurePolicy"] == "Ignore"
    rec = reconciler(api, tmp_path, config_map="missing")
    rec.reconcile()
    assert rec.seen == []


def test_a_malformed_config_map_fails_the_round_loudly(tmp_path):
    api = WholeConfigApi()
    api.config_maps["dra-guard"]["webhooks.json"] = "{"
    rec = reconciler(api, tmp_path)
    with pytest.raises(ValueError, match="not JSON"):
        rec.reconcile()
