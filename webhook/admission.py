"""AdmissionReview in -> policy -> AdmissionReview out. Transport-agnostic: no Flask here.

Handles what every policy shares: envelope validation (admission.k8s.io/v1 and v1beta1), echoing
apiVersion, kind and request.uid, the mode (enforce / warn / audit, like ValidatingAdmissionPolicy's
validationActions Deny / Warn / Audit), warnings, auditAnnotations, JSON Patch encoding, dry run
(same answer, nothing but the answer happens) and a policy's failure mode when it raises.
Source: Kubernetes "Dynamic Admission Control", AdmissionReview request/response fields.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from webhook import metrics
from webhook.config import PolicyConfig
from webhook.policies.decision import Decision, Tally, short
from webhook.policies.registry import source_of

log = logging.getLogger("dra_guard.admission")

_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    """metric.labels(*values), the label values in the metric's label order, kept after the first
    call: prometheus_client's labels() validates and looks the values up under a lock each time
    (~3 us, four times in every review). Only for the per-review metrics counted here, whose
    children are never removed and whose label values come from small fixed sets (policy,
    operation, decision, mode, check): the cache is never emptied."""
    key = (id(metric), values)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*values)
    return found


API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")

PolicyFunc = Callable[[Mapping[str, Any]], Decision]


class BadRequest(ValueError):
    """The body is not a usable AdmissionReview; answered with HTTP 400 and this message."""


def parse_review(body: bytes) -> dict[str, Any]:
    """Parse and check an AdmissionReview body (bytes of JSON).

    Returns the review dict. Raises BadRequest naming the problem: not UTF-8 JSON, not an object,
    kind not AdmissionReview, unknown apiVersion, no request, no request.uid.
    """
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(review, dict):
        raise BadRequest(f"body must be a JSON object (an AdmissionReview), got {type(review).__name__}")
    if review.get("kind") != "AdmissionReview":
        raise BadRequest(f"kind must be AdmissionReview, got {short(repr(review.get('kind')), 80)}")
    if review.get("apiVersion") not in API_VERSIONS:
        raise BadRequest(f"apiVersion must be one of {', '.join(API_VERSIONS)}, got {short(repr(review.get('apiVersion')), 80)}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadRequest("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadRequest("request.uid is missing or not a non-empty string")
    return review


class NotJudged(Exception):
    """A review dra-guard does not judge: too large (server.limits), overloaded, or past its deadline
    (server.reviewDeadlineSeconds). respond() answers it with not_judged(); `why` says which, for
    the answer's message and the log."""

    def __init__(self, why: str, *, cause: str) -> None:
        super().__init__(why)
        self.why = why
        self.cause = cause  # metric label: limit, overload, deadline


def not_judged(response: dict[str, Any], *, policy: str, settings: PolicyConfig, first: bool, why: str) -> None:
    """Fill `response` (with its uid) for a review that was not judged (NotJudged).

    In warn and audit mode: allowed (warn: with a warning), as those modes never refuse. In enforce
    mode, first (the registry's Policy.first, the eviction guard): 429 TooManyRequests, the answer
    drains retry, whatever the failureMode, never an allow. Otherwise the policy's failureMode: deny
    refuses with 503 ServiceUnavailable ("retry"), allow admits with a warning.
    """
    text = f"dra-guard did not judge this request ({why}); retry"
    if settings.mode != "enforce":
        # warn and audit never refuse, so neither does a review they could not judge
        response["allowed"] = True
        if settings.mode == "warn":
            response["warnings"] = [short(f"dra-guard: policy {policy} not applied: {why}")]
    elif first:
        response.update(allowed=False, status=_status(429, "TooManyRequests", text))
    elif settings.failure_mode == "deny":
        response.update(allowed=False, status=_status(503, "ServiceUnavailable", text))
    else:
        response["allowed"] = True
        response["warnings"] = [short(f"dra-guard: policy {policy} not applied: {why}")]


def overload_answer(
    review: Mapping[str, Any],
    *,
    policy: str,
    settings: PolicyConfig,
    first: bool,
    why: str,
    cause: str = "overload",
    counted: bool = True,
) -> dict[str, Any]:
    """The AdmissionReview answer (apiVersion, kind, response with the request's uid) for a review
    not judged, as not_judged() fills it; counted in dra_guard_reviews_not_judged_total unless
    `counted` is False (whoever still judges it counts it: webhook.serve.lanes.Gate.judge)."""
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
    not_judged(response, policy=policy, settings=settings, first=first, why=why)
    if counted:
        metrics.NOT_JUDGED.labels(policy=policy, cause=cause).inc()
    return {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}


_PEEK = re.compile(
    rb'^\s*\{\s*"kind"\s*:\s*"AdmissionReview"\s*,\s*"apiVersion"\s*:\s*"(admission\.k8s\.io/v1(?:beta1)?)"'
    rb'\s*,\s*"request"\s*:\s*\{\s*"uid"\s*:\s*"([0-9A-Za-z._-]{1,128})"'
)


def peek_review(body: bytes) -> dict[str, Any] | None:
    """apiVersion and request.uid of an AdmissionReview body as the kube-apiserver writes it (kind,
    apiVersion, then request with uid first), found without parsing the rest; None when the body
    does not start that way (then parse_review). Only for answers that need nothing else."""
    found = _PEEK.match(body[:4096])
    if found is None:
        return None
    return {"apiVersion": found.group(1).decode(), "kind": "AdmissionReview", "request": {"uid": found.group(2).decode()}}


def _username(request: Mapping[str, Any]) -> str:
    info = request.get("userInfo")
    name = info.get("username") if isinstance(info, Mapping) else None
    return name[:256] if isinstance(name, str) else ""


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"code": code, "reason": reason, "message": message, "status": "Failure" if code >= 400 else "Success"}


def respond(
    review: Mapping[str, Any],
    *,
    policy: str,
    evaluate: PolicyFunc,
    settings: PolicyConfig,
    first: bool = False,
    limits: Callable[[Mapping[str, Any]], str | None] | None = None,
) -> dict[str, Any]:
    """Answer a parsed AdmissionReview (from parse_review) with policy `policy`.

    evaluate: the policy, request dict -> Decision (enforce-mode verdict).
    settings: the policy's mode and failureMode. first: the registry's Policy.first (see not_judged).
    limits: request -> why it is too large to judge, or None (webhook.model.limits.over_limit).
    Returns the response AdmissionReview dict with the request's apiVersion and uid echoed.
    Never raises for a policy error: the policy's failureMode answers instead; a NotJudged (a
    limit, overload, the deadline) is answered by not_judged().
    """
    started = time.perf_counter()
    request = review["request"]
    uid = request["uid"]
    operation = request.get("operation")
    operation = operation if operation in OPERATIONS else "other"  # bounded metric labels
    mode = settings.mode
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    try:
        too_large = limits(request) if limits is not None else None
        if too_large:
            raise NotJudged(too_large, cause="limit")
        decision = evaluate(request)
    except NotJudged as exc:
        metrics.NOT_JUDGED.labels(policy=policy, cause=exc.cause).inc()
        log.warning("review not judged", extra={"uid": uid, "policy": policy, "why": exc.why, "cause": exc.cause})
        not_judged(response, policy=policy, settings=settings, first=first, why=exc.why)
        outcome = "error"
    except Exception:
        metrics.POLICY_ERRORS.labels(policy=policy).inc()
        log.exception(
            "policy raised; answering with its failureMode",
            extra={"uid": uid, "policy": policy, "failureMode": settings.failure_mode},
        )
        text = f"dra-guard: internal error in policy {policy} (request uid {uid}); see the dra-guard logs"
        if mode != "enforce":
            # warn and audit never refuse: an internal error there is logged and counted only
            if mode == "warn":
                response["warnings"] = [short(text)]
        elif settings.failure_mode == "deny" and first:
            # the eviction guard: 429, which drains retry (a 500 stops kubectl drain)
            response.update(allowed=False, status=_status(429, "TooManyRequests", text + "; retry"))
        elif settings.failure_mode == "deny":
            response.update(allowed=False, status=_status(500, "InternalError", text))
        else:
            response["warnings"] = [short(text)]
        outcome = "error"
    else:
        outcome = _apply_mode(decision, mode=mode, policy=policy, response=response)
        if decision.findings:
            refused = sum(1 for f in decision.findings if f.enforced)
            if refused:
                _child(metrics.VIOLATIONS, policy, mode).inc(refused)
            for f in decision.findings:
                _child(metrics.FINDINGS, policy, f.check, mode).inc()
            log.info(
                "finding",
                extra={
                    "uid": uid,
                    "policy": policy,
                    "mode": mode,
                    "decision": outcome,
                    "operation": operation,
                    "dryRun": request.get("dryRun") is True,
                    "user": _username(request),
                    "findings": [f.as_dict(mode=mode) for f in decision.findings],
                },
            )
    _child(metrics.ADMISSION_REQUESTS, policy, operation, outcome, mode).inc()
    _child(metrics.ADMISSION_DURATION, policy).observe(time.perf_counter() - started)
    return {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}


def record_tally(tally: Tally) -> None:
    """Count what a policy's final answer adds to its own metrics (the registry's `account`):
    dra_guard_driver_evictions_total{driver,decision} and dra_guard_blocking_claims{node}."""
    for driver, decision in tally.driver_evictions:
        metrics.DRIVER_EVICTIONS.labels(driver=driver, decision=decision).inc()
    for node, claims in tally.blocking_claims:
        metrics.BLOCKING_CLAIMS.labels(node=node).set(claims)


def _apply_mode(decision: Decision, *, mode: str, policy: str, response: dict[str, Any]) -> str:
    """Fill `response` from `decision` under `mode`; return the outcome label for metrics.

    enforce: refuse on an enforced finding (its code and reason), apply the patch, show advisory
    findings as warnings (except those the patch fixes). warn: allow, no patch, every finding
    as a warning. audit: allow, no patch, no warning. Every mode records findings as audit annotations.
    """
    warnings = list(decision.warnings) if mode != "audit" else []
    annotations = dict(decision.audit_annotations)
    refusals = [f for f in decision.findings if f.enforced]
    outcome = "allow"
    if decision.findings:
        annotations[f"{policy}-mode"] = mode
        annotations[f"{policy}-finding"] = " | ".join(f.message for f in decision.findings)[:4000]
        outcome = {"enforce": "deny" if refusals else "allow", "warn": "warn", "audit": "audit"}[mode]
    if mode == "enforce":
        if refusals:
            # the source page's section, so whoever is refused can read why (policies.registry)
            message = " ".join(f.message for f in refusals) + f" Why: {source_of(policy)}"
            response.update(allowed=False, status=_status(refusals[0].code, refusals[0].reason, message))
        patched = bool(decision.patch) and response["allowed"]
        if patched:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(list(decision.patch)).encode()).decode()
            annotations[f"{policy}-patched"] = " | ".join(f.message for f in decision.findings if f.fixed_by_patch)[:4000]
            _child(metrics.PATCHES, policy).inc()
            outcome = "patch"
        warnings.extend(f.summary for f in decision.findings if not f.enforced and not (patched and f.fixed_by_patch))
        if patched:
            # kubectl shows it: nobody should find a changed object without being told
            warnings.extend(
                f"dra-guard changed this {f.kind} ({policy}): "
                + f.summary.removeprefix("dra-guard would ").removeprefix("dra-guard ")
                for f in decision.findings
                if f.fixed_by_patch
            )
    elif mode == "warn":
        warnings.extend(f.summary for f in decision.findings)
    if warnings:
        response["warnings"] = [short(w) for w in warnings]
    if annotations:
        response["auditAnnotations"] = annotations
    return outcome
