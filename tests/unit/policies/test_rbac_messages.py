"""No RBAC message ever has an empty name in it: every template of webhook.policies.rbac_violations
(who may hold what, the setting that admits it) filled with every kind of subject, binding and grant
dra-guard knows (each DRA resource, each escalation power, namespaced or not), and the other
findings of the RBAC policy. Seen before: "only cluster admins may write ;" and "add  to
rbac.driverResources" for a driver given a namespaced power through a ClusterRoleBinding."""

from __future__ import annotations

import itertools
import re

import pytest

from tests.builders import review
from webhook.config import from_mapping
from webhook.model.powers import POWER_GROUPS
from webhook.model.rbac import Grant, Subject
from webhook.policies import admin_access, rbac
from webhook.policies.rbac_violations import Violation, describe, may_hold

CONFIG = from_mapping(
    {
        "rbac": {
            "driverSubjects": {"serviceAccounts": ["dra-system:driver"], "users": ["driver-user"]},
            "driverResources": ["resourceslices"],
        }
    }
).rbac
#: an empty name leaves two separators together, or a separator after a space, or empty brackets
EMPTY = re.compile(r"  |\s[;,.:)\]}]|\(\s*\)|\[\s*\]|\{\s*\}|\b(to|hold|write|add|may|of|on|in|namespace|via)\s*[;,.]")
SUBJECTS = [
    Subject("User", "alice"),
    Subject("Group", "team-a"),
    Subject("User", "driver-user"),
    Subject("ServiceAccount", "driver", "dra-system"),
    Subject("ServiceAccount", "tool", "team-a"),
    Subject("ServiceAccount", "dra-guard", "dra-guard"),
]
DRA = sorted(CONFIG.protected_resources)
POWERS = sorted(POWER_GROUPS)
GRANT_SETS = (
    [[r] for r in DRA]
    + [[p] for p in POWERS]
    + [["resourceslices", p] for p in ("pods", "leases", "impersonate:users")]
    + [["devicetaintrules", "resourceslices"], ["deviceclasses", "pods", "secrets"]]
)


def grants(names, namespaced):
    return tuple(Grant(resource=n, verb="create", role="r", namespaced=namespaced and n in POWERS) for n in names)


@pytest.mark.parametrize("names", GRANT_SETS, ids=lambda n: "+".join(n))
def test_no_violation_message_has_an_empty_name(names):
    for s, namespace, namespaced in itertools.product(SUBJECTS, ("", "dra-system", "kube-system"), (False, True)):
        v = Violation(binding="b", subject=s, grants=grants(names, namespaced), via="r", namespace=namespace)
        for on_role in (False, True):
            message, summary = describe(v, CONFIG, on_role=on_role)
            for text in (message, summary):
                assert not EMPTY.search(text), (s, namespace, names, EMPTY.search(text), text)
        for g in v.grants:  # each grant the subject may not hold is named (those it may are not its violation)
            assert may_hold(s, g, CONFIG, namespace=namespace) or g.resource in message


def test_the_other_rbac_findings_have_no_empty_name():
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "labels": {admin_access.LABEL: "true"}}}
    request = {
        "uid": "u",
        "operation": "CREATE",
        "kind": {"group": "", "version": "v1", "kind": "Namespace"},
        "name": "n",
        "object": namespace,
        "userInfo": {"username": "alice", "groups": []},
    }
    texts = [f.message for f in rbac.review(request, index=rbac.RbacIndex(), config=CONFIG).findings]
    own = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "dra-guard"},
        "rules": [],
    }
    texts += [
        f.message
        for f in rbac.review(review(own, operation="UPDATE", old=own)["request"], index=rbac.RbacIndex(), config=CONFIG).findings
    ]
    unsynced = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "x"}, "rules": []}
    texts += [
        f.message
        for f in rbac.review(
            review(unsynced)["request"], index=rbac.RbacIndex(), config=CONFIG, synced=(False, "watch lost")
        ).findings
    ]
    assert len(texts) == 3
    for text in texts:
        assert not EMPTY.search(text), text


def test_the_real_charts_messages_stay_short_with_their_longest_names():
    """The longest names of the charts people install (NVIDIA's compute-domain daemon: a 34-character
    binding, a 59-character ServiceAccount, each said twice) still give a message about
    MESSAGE_BUDGET long, ending with the exception that admits it: a PolicyReport keeps 1,024
    characters of it with the role's name in front."""
    from tests.rbac_charts import NVIDIA_DAEMON_BINDING, NVIDIA_SERVICE_ACCOUNTS, nvidia_dra_driver_gpu
    from webhook.policies.rbac_violations import MESSAGE_BUDGET

    config = from_mapping({"rbac": {"driverSubjects": {"serviceAccounts": list(NVIDIA_SERVICE_ACCOUNTS)}}}).rbac
    [daemon] = [
        f for f in rbac.audit(rbac.RbacIndex.from_objects(nvidia_dra_driver_gpu()), config) if f.name == NVIDIA_DAEMON_BINDING
    ]
    assert len(daemon.message) <= MESSAGE_BUDGET + 70, daemon.message
    assert daemon.message.endswith("with reason, owner, expires.") and "add the rbac exception" in daemon.message
