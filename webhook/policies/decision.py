"""What a policy answers: a Decision made of Findings, warnings and a patch (pure data).

The decision says what *enforce* mode would answer; applying the configured mode (enforce / warn /
audit) is the job of webhook.admission. An allow may depend on a shared record the serving replica
must own first (Decision.record; webhook.serve.app writes it through webhook.kube.records, then
Decision.settle gives the final answer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from webhook.model.leaving import LeaveRecord
from webhook.model.readers import short

__all__ = ["ALLOW", "Decision", "Finding", "Record", "Tally", "short"]

#: results of writing a Record: owned (the allow holds) or not (the refusal answers)
OWNED = ("created", "renewed", "taken_over")


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
class Record:
    """A shared record an allow depends on: the replica answering must own `lease` first.

    conflict: the enforced finding answered when another holder owns it. failed: the one answered
    when it could not be written (API error, timeout); settle() appends the cause to its message.
    """

    lease: LeaveRecord
    conflict: Finding
    failed: Finding


@dataclasses.dataclass(frozen=True)
class Decision:
    """A policy's verdict on one admission request, as enforce mode would answer it.

    findings: violations (allowed is False when any is enforced) and advisory findings.
    warnings: informational messages (each under 120 characters) shown in enforce and warn modes.
    patch: JSON Patch operations (RFC 6902 dicts) for mutating policies, empty otherwise.
    audit_annotations: extra AdmissionResponse.auditAnnotations (key without prefix -> value).
    record: when set, this allow holds only once the serving replica owns the record; settle()
    gives the answer after the write (no API configured: the decision as it is).
    """

    findings: tuple[Finding, ...] = ()
    warnings: tuple[str, ...] = ()
    patch: tuple[Mapping[str, Any], ...] = ()
    audit_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    record: Record | None = None

    @property
    def allowed(self) -> bool:
        """True when no finding is enforced."""
        return not any(f.enforced for f in self.findings)

    def settle(self, result: str, why: str = "") -> Decision:
        """The answer once `record` was written: `result` one of OWNED (or "unrecorded": no API to
        write to) -> this decision without the record; "conflict" -> record.conflict; anything
        else ("error") -> record.failed. `why` (the holder, or the error) ends the message."""
        if self.record is None or result in (*OWNED, "unrecorded"):
            return dataclasses.replace(self, record=None)
        finding = self.record.conflict if result == "conflict" else self.record.failed
        if why:
            finding = dataclasses.replace(finding, message=f"{finding.message} (Shared record: {why}.)")
        return Decision(findings=(finding,))


@dataclasses.dataclass(frozen=True)
class Tally:
    """What a policy's final answer adds to its own metrics (pure data: the policy says what to
    count, webhook.admission.record_tally counts it; policies import no metrics).

    driver_evictions: (driver, decision) pairs, each one more dra_guard_driver_evictions_total.
    blocking_claims: (node, claims) pairs, each setting dra_guard_blocking_claims{node} to claims.
    """

    driver_evictions: tuple[tuple[str, str], ...] = ()
    blocking_claims: tuple[tuple[str, int], ...] = ()


ALLOW = Decision()
