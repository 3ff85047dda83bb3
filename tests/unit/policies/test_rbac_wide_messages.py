"""A wide role's refusal is readable: a binding of cluster-admin (the commonest mistake) or of a role
with `*` on `*` gets a message of at most 600 characters that says what is granted (counts), names
each resource at most once (the first few of the list, "and N more"), and gives the fix in its
second sentence; the finding's JSON details and the PolicyReport's properties keep every resource."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.builders import binding, cluster_role, review, rule, subject
from webhook.cli import main
from webhook.config import from_mapping
from webhook.model import bootstrap
from webhook.model.powers import POWER_GROUPS
from webhook.policies import rbac

CONFIG = from_mapping(None)
EVERYTHING = cluster_role("everything", [rule(["*"], ["*"], groups=["*"])])
#: every resource a message could name
ALL = sorted(set(POWER_GROUPS) | CONFIG.rbac.protected_resources)
#: what cluster-admin (and `*` on `*`) holds that only cluster admins may: 3 DRA resources, 38 powers
WIDE = 41
SUBJECTS = [subject("User", "alice"), subject("Group", "team-a"), subject("ServiceAccount", "deployer", "ci")]


def named(resource: str, text: str) -> int:
    """How often `resource` is named in `text` as a word of its own ("pods" not in "pods/exec")."""
    return len(re.findall(rf"(?<![\w/:-]){re.escape(resource)}(?![\w/:-])", text))


def check_readable(message: str) -> None:
    assert len(message) <= 600, (len(message), message)
    verdict, fix = message.split(". ", 2)[:2]
    assert " grants " in verdict and "only cluster admins may hold" in verdict and " more" in verdict
    assert fix.startswith("Bind a narrower role") and "rbac exception" in fix
    twice = [r for r in ALL if named(r, message) > 1]
    assert not twice, (twice, message)


def refusals(objects, *, namespace=""):
    roles = [o for o in objects if o["kind"] in ("ClusterRole", "Role")]
    index = rbac.RbacIndex.from_objects([bootstrap.stored_role("cluster-admin"), *roles])
    out = []
    for s in SUBJECTS:
        for role in ("cluster-admin", "everything"):
            b = binding(f"wide-{role}", role, [s])
            if namespace:
                b["kind"] = "RoleBinding"
                b["metadata"]["namespace"] = namespace
            decision = rbac.review(review(b)["request"], index=index, config=CONFIG.rbac)
            assert not decision.allowed
            out += decision.findings
    return out


@pytest.mark.parametrize("namespace", ["", "kube-system"], ids=["ClusterRoleBinding", "RoleBinding-in-kube-system"])
def test_a_wide_binding_is_refused_in_at_most_600_characters_fix_second_no_resource_twice(namespace):
    findings = refusals([EVERYTHING], namespace=namespace)
    assert len(findings) == 6
    for f in findings:
        check_readable(f.message)
        assert len(f.summary) < 120 and " more via " in f.summary
        if not namespace:
            assert len(f.details["resources"]) == WIDE  # the whole list stays in the finding


def test_a_role_widened_to_everything_is_refused_in_at_most_600_characters():
    old = cluster_role("ops", [rule(["configmaps"], ["get"], groups=[""])])
    crb = binding("ops", "ops", [subject("Group", "ops-team")])
    new = cluster_role("ops", [rule(["*"], ["*"], groups=["*"])])
    index = rbac.RbacIndex.from_objects([old, crb])
    [f] = rbac.review(review(new, operation="UPDATE", old=old)["request"], index=index, config=CONFIG.rbac).findings
    assert f.kind == "ClusterRole" and len(f.message) <= 600, (len(f.message), f.message)
    assert "have a cluster admin make this change" in f.message
    assert not [r for r in ALL if named(r, f.message) > 1]


def test_the_audit_json_and_the_policyreport_keep_every_resource(tmp_path, capsys):
    """dra-guard audit -f of a cluster-admin binding (the role's manifest among the files): the
    message is short, the JSON finding's details and the report's properties hold all 41."""
    objects = [
        bootstrap.stored_role("cluster-admin"),
        binding("alice-admin", "cluster-admin", [subject("User", "alice")]),
    ]
    path = tmp_path / "wide.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    assert main(["audit", "-f", str(path), "-o", "json"]) == 1
    [finding] = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["name"] == "alice-admin"]
    check_readable(finding["message"])
    assert len(finding["details"]["resources"]) == WIDE
    assert main(["audit", "-f", str(path), "-o", "policyreport"]) == 1
    reports = list(yaml.safe_load_all(capsys.readouterr().out))
    [result] = [r for report in reports if report for r in report["results"] if r["policy"] == "rbac"]
    assert result["message"] == finding["message"]  # whole: no cut at 1024 characters
    assert result["properties"]["resources"].split(", ") == finding["details"]["resources"]
