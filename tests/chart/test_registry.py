"""The chart follows webhook/policies/registry.py: one webhook per policy at the policy's path, in
the Mutating configuration exactly when the policy mutates, its values under webhooks.<name>, and
the latency alert over every policy. A policy added to the registry without the chart fails here."""

from __future__ import annotations

import re

import yaml

from tests.chart import helm
from tests.chart.test_render import rendered
from webhook.policies.registry import POLICIES


def test_every_policy_has_its_webhook_at_its_path_and_nothing_else_is_registered():
    found: dict[str, tuple[str, str]] = {}  # the eviction policy's two webhooks share its path
    for obj in rendered("declared-drivers"):
        if obj["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            for webhook in obj["webhooks"]:
                service = webhook["clientConfig"]["service"]
                found[service["path"]] = (obj["kind"], webhook["name"])
    expected = {p.path: "MutatingWebhookConfiguration" if p.mutating else "ValidatingWebhookConfiguration" for p in POLICIES}
    assert {path: kind for path, (kind, _) in found.items()} == expected


def test_every_policy_has_its_webhook_values():
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())
    for policy in POLICIES:
        settings = values["webhooks"][policy.name]
        assert {"failurePolicy", "timeoutSeconds"} <= set(settings), policy.name
        # the rendered config's failure mode for an internal error stays the registry's default
        assert (
            values["config"].get("policies", {}).get(policy.name, {}).get("failureMode", policy.failure_mode)
            == policy.failure_mode
        )


def test_the_latency_alert_covers_every_policy_and_no_other():
    rule_objects = [o for o in rendered("monitoring") if o["kind"] == "PrometheusRule"]
    rules = [r for o in rule_objects for g in o["spec"]["groups"] for r in g["rules"]]
    latency = next(r for r in rules if r.get("alert") == "DraGuardLatencyNearTimeout")
    assert sorted(re.findall(r'policy="([^"]+)"', latency["expr"])) == sorted(p.name for p in POLICIES)
