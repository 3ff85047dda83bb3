"""What a policy answers: a Decision made of Findings, warnings and a patch (pure data).

The decision says what *enforce* mode would answer; applying the configured mode (enforce / warn /
audit) is the job of webhook.admission.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from webhook.model.readers import short

__all__ = ["ALLOW", "Decision", "Finding", "short"]


@dataclasses.dataclass(frozen=True)
class Finding:
    """One rule violation: what enforce mode refuses, warn mode warns about, audit mode records.

    code/reason become the AdmissionResponse status when the finding is enforced (403 Forbidden
    for RBAC; 429 TooManyRequests where the client should retry). `summary` is under 120
    characters for kubectl warnings; `message` is the full, actionable text.
    check: a stable id of the rule that found it (e.g. "rbac-write", "missing-liveness-probe").
    enforced: False for advisory findings, which enforce mode shows as warnings but never refuses.
    fixed_by_patch: the Decision's patch resolves it (enforce mode applies the patch and stays quiet).
    exception: set when a live exception of the config skips it (webhook.policies.exceptions): the
    exception's ref, reason, owner and expires (RFC 3339); enforced and fixed_by_patch are then False.
    """

    policy: str
    kind: str
    name: str
    message: str
    summary: str
    namespace: str = ""
    code: int = 403
    reason: str = "Forbidden"
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    check: str = ""
    enforced: bool = True
    fixed_by_patch: bool = False
    exception: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def skipped(self) -> bool:
        """Whether a live exception skips it (PolicyReport result `skip`)."""
        return bool(self.exception)

    def as_dict(self, *, mode: str) -> dict[str, Any]:
        """The JSON form used by `dra-guard audit --output json` and structured logs."""
        return {
            "policy": self.policy,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "mode": mode,
            "check": self.check,
            "enforced": self.enforced,
            "patch": self.fixed_by_patch,
            "message": self.message,
            **({"details": dict(self.details)} if self.details else {}),
            **({"exception": dict(self.exception)} if self.exception else {}),
        }


@dataclasses.dataclass(frozen=True)
class Decision:
    """A policy's verdict on one admission request, as enforce mode would answer it.

    findings: violations (allowed is False when any is enforced) and advisory findings.
    warnings: informational messages (each under 120 characters) shown in enforce and warn modes.
    patch: JSON Patch operations (RFC 6902 dicts) for mutating policies, empty otherwise.
    audit_annotations: extra AdmissionResponse.auditAnnotations (key without prefix -> value).
    """

    findings: tuple[Finding, ...] = ()
    warnings: tuple[str, ...] = ()
    patch: tuple[Mapping[str, Any], ...] = ()
    audit_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def allowed(self) -> bool:
        """True when no finding is enforced."""
        return not any(f.enforced for f in self.findings)


ALLOW = Decision()
