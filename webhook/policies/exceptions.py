"""Applying the config's exceptions (webhook.config.exceptions) to findings: pure, the time given.

A finding is covered by an exception when policy, kind, namespace and name are the exception's
(exact), its check is one the policy lets be excepted (config EXCEPTABLE) and, for rbac, its
subject, roleRef and resources are among those the exception names. Then:
- the exception is live (now < expires): the finding is skipped: not enforced, no patch, its
  summary a warning naming the exception (owner, expiry), its message saying so; audits report
  it as `skip`;
- the exception expired: the finding stands (refused, reported as before) and says the exception
  expired; audits add one finding `exception-expired` per expired exception that covers one.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Sequence

from webhook.config import EXCEPTABLE, PolicyException
from webhook.model.rbac import Subject
from webhook.policies.decision import Decision, Finding, short

__all__ = ["EXPIRED_CHECK", "admit", "apply", "covering", "expired_finding", "skip", "stamp"]

#: the check of the finding an expired exception that still covers a finding becomes
EXPIRED_CHECK = "exception-expired"

#: a finding and the mode its policy runs in (webhook.audit.run.Result)
Result = tuple[Finding, str]


def stamp(when: datetime.datetime) -> str:
    """`when` as an RFC 3339 UTC time with "Z" (as Kubernetes writes times), in every message."""
    return when.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


def covers(exception: PolicyException, finding: Finding) -> bool:
    """Whether `exception` is about `finding` (live or not; see the module docstring)."""
    kinds, checks = EXCEPTABLE.get(exception.policy, ((), frozenset()))
    if (finding.policy, finding.kind, finding.namespace, finding.name) != (
        exception.policy,
        exception.kind,
        exception.namespace,
        exception.name,
    ):
        return False
    if finding.kind not in kinds or (checks is not None and finding.check not in checks):
        return False
    if exception.policy != "rbac":
        return True
    subject = Subject.parse(str(finding.details.get("subject", "")))
    resources = finding.details.get("resources") or ()
    return (
        subject is not None
        and finding.details.get("roleRef") == exception.role_ref
        and exception.subjects.contains(kind=subject.kind, name=subject.name, namespace=subject.namespace)
        and bool(resources)
        and set(resources) <= exception.resources
    )


def covering(finding: Finding, exceptions: Sequence[PolicyException]) -> PolicyException | None:
    """The exception (at most one per object and policy: the loader refuses repeats) covering `finding`."""
    return next((e for e in exceptions if covers(e, finding)), None)


def skip(finding: Finding, exception: PolicyException) -> Finding:
    """`finding` skipped by live `exception`: not enforced, no patch, the exception in its
    message, summary (the kubectl warning) and `exception` field."""
    expires = stamp(exception.expires)
    return dataclasses.replace(
        finding,
        enforced=False,
        fixed_by_patch=False,
        exception={"ref": exception.ref, "reason": exception.reason, "owner": exception.owner, "expires": expires},
        message=f"{finding.message} Skipped: exception {exception.ref} (owner {exception.owner}, expires {expires}): "
        f"{exception.reason}",
        summary=short(f"dra-guard: allowed by exception {exception.ref} (owner {exception.owner}, expires {expires})"),
    )


def _expired_note(finding: Finding, exception: PolicyException) -> Finding:
    return dataclasses.replace(
        finding,
        message=f"{finding.message} The exception {exception.ref} (owner "
        f"{exception.owner}) expired at {stamp(exception.expires)}.",
    )


def expired_finding(exception: PolicyException) -> Finding:
    """The advisory finding for an expired exception that still covers a finding."""
    return Finding(
        policy=exception.policy,
        kind=exception.kind,
        namespace=exception.namespace,
        name=exception.name,
        check=EXPIRED_CHECK,
        enforced=False,
        message=f"The exception {exception.ref} (owner {exception.owner}: {exception.reason}) expired at "
        f"{stamp(exception.expires)} and no longer skips the findings of this object: fix the object, or "
        f"renew the exception (a new expires in dra-guard's config, key exceptions) or remove it.",
        summary=short(f"dra-guard: exception {exception.ref} expired at {stamp(exception.expires)}"),
        details={"owner": exception.owner, "expires": stamp(exception.expires)},
    )


def admit(
    decision: Decision, exceptions: Sequence[PolicyException], *, now: datetime.datetime
) -> tuple[Decision, list[PolicyException], list[PolicyException]]:
    """An admission Decision with the exceptions applied at `now` (an aware datetime): (the
    decision, the live exceptions that skipped a finding, the expired ones that covered one).
    Skipped findings are no longer enforced and their patch is dropped (kept while a finding it
    fixes is not skipped); an audit annotation `exception` names the exception."""
    if not exceptions or not decision.findings:
        return decision, [], []
    findings: list[Finding] = []
    used: list[PolicyException] = []
    expired: list[PolicyException] = []
    for f in decision.findings:
        exception = covering(f, exceptions)
        if exception is None:
            findings.append(f)
        elif exception.live(now):
            findings.append(skip(f, exception))
            used += [exception] if exception not in used else []
        else:
            findings.append(_expired_note(f, exception))
            expired += [exception] if exception not in expired else []
    if not used:
        return dataclasses.replace(decision, findings=tuple(findings)), used, expired
    patch = decision.patch if any(f.fixed_by_patch for f in findings) else ()
    annotation = " | ".join(f"{e.ref} owner={e.owner} expires={stamp(e.expires)}: {e.reason}" for e in used)
    return (
        dataclasses.replace(
            decision,
            findings=tuple(findings),
            patch=patch,
            audit_annotations={**decision.audit_annotations, "exception": annotation[:4000]},
        ),
        used,
        expired,
    )


def apply(results: Iterable[Result], exceptions: Sequence[PolicyException], *, now: datetime.datetime) -> list[Result]:
    """Audit results with the exceptions applied at `now`: covered by a live exception, a finding
    is skipped (Finding.skipped); by an expired one, it stands with a note, and one
    `exception-expired` finding per such exception follows it (in its policy's mode)."""
    out: list[Result] = []
    reported: set[PolicyException] = set()
    for f, mode in results:
        exception = covering(f, exceptions) if exceptions else None
        if exception is None:
            out.append((f, mode))
        elif exception.live(now):
            out.append((skip(f, exception), mode))
        else:
            out.append((_expired_note(f, exception), mode))
            if exception not in reported:
                reported.add(exception)
                out.append((expired_finding(exception), mode))
    return out
