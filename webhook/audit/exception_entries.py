"""`dra-guard audit --suggest-exception`: config entries (`exceptions:`) that would skip the audit's
findings, filled from the findings themselves (roleRef, subjects, resources, as
webhook.policies.exceptions matches them) and from the admin's flags (owner, reason, expiry).

Only what an exception may cover is suggested (docs/policies/exceptions.md): rbac ``rbac-write``
findings on a ClusterRoleBinding or RoleBinding, and probes findings on a DaemonSet; an eviction
finding is never excepted, and neither is an advisory one (nothing to skip)."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable

from webhook.model.rbac import Subject
from webhook.policies.decision import Finding
from webhook.policies.exceptions import stamp

HEADER = (
    "# dra-guard audit --suggest-exception: exceptions that skip these findings until {expires}.\n"
    "# Review each one: an exception lets exactly this binding (roleRef, subjects, resources) or\n"
    "# DaemonSet through. Add them to the Helm value config.exceptions (a list: keep the entries you\n"
    "# have) and apply with:\n"
    "#   helm upgrade RELEASE CHART -n NAMESPACE --reset-then-reuse-values -f THIS_FILE\n"
)
BINDINGS = ("ClusterRoleBinding", "RoleBinding")


def _subject_entry(subjects: Iterable[str]) -> dict[str, list[str]]:
    """The exception's `subjects` from findings' "Kind name" / "ServiceAccount ns/name" strings."""
    out: dict[str, set[str]] = {}
    for text in subjects:
        subject = Subject.parse(text)
        if subject is None:
            continue
        if subject.kind == "ServiceAccount":
            out.setdefault("serviceAccounts", set()).add(f"{subject.namespace}:{subject.name}")
        else:
            out.setdefault("groups" if subject.kind == "Group" else "users", set()).add(subject.name)
    return {key: sorted(values) for key, values in sorted(out.items())}


@dataclasses.dataclass
class _Entry:
    """One suggested exception, gathered over the findings of one object."""

    policy: str
    kind: str
    namespace: str
    name: str
    role_ref: str = ""
    subjects: set[str] = dataclasses.field(default_factory=set)
    resources: set[str] = dataclasses.field(default_factory=set)

    def as_config(self, *, owner: str, reason: str, expires: str) -> dict[str, object]:
        """The entry as config.exceptions holds it (webhook.config.exceptions.PolicyException)."""
        out: dict[str, object] = {"policy": self.policy, "kind": self.kind}
        if self.namespace:
            out["namespace"] = self.namespace
        out["name"] = self.name
        if self.policy == "rbac":
            out.update(roleRef=self.role_ref, subjects=_subject_entry(self.subjects), resources=sorted(self.resources))
        out.update(reason=reason, owner=owner, expires=expires)
        return out


def suggest_exceptions(findings: Iterable[Finding], *, owner: str, reason: str, expires: datetime.datetime) -> str:
    """YAML (under ``config: exceptions:``) with one entry per object of `findings` an exception
    may cover (acting findings not already skipped), or a comment saying there is none.

    expires: an aware datetime, at most webhook.config.exceptions.MAX_DAYS ahead (the caller checks)."""
    entries: dict[tuple[str, str, str, str], _Entry] = {}
    for f in findings:
        if f.skipped or not (f.enforced or f.fixed_by_patch):
            continue
        key = (f.policy, f.kind, f.namespace, f.name)
        if f.policy == "rbac" and f.check == "rbac-write" and f.kind in BINDINGS:
            entry = entries.setdefault(key, _Entry(*key, role_ref=str(f.details.get("roleRef", ""))))
            entry.subjects.add(str(f.details.get("subject", "")))
            entry.resources.update(f.details.get("resources") or ())
        elif f.policy == "probes" and f.kind == "DaemonSet":
            entries.setdefault(key, _Entry(*key))
    when = stamp(expires)
    head = HEADER.format(expires=when)
    if not entries:
        return head + "# No finding an exception may skip (rbac-write on bindings, probes on DaemonSets).\nconfig: {}\n"
    lines = ["config:", "  exceptions:"]
    lines += ["    - " + json.dumps(e.as_config(owner=owner, reason=reason, expires=when)) for e in entries.values()]
    return head + "\n".join(lines) + "\n"
