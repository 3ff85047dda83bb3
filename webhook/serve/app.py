"""Flask app factory: routes, body limits, JSON errors, metrics. Nothing else.

Routes (the policies' paths come from webhook.policies.registry):
  POST /validate/rbac     the RBAC guard (ClusterRoles, ClusterRoleBindings, RoleBindings)
  POST /mutate/daemonsets the driver liveness probes (apps/v1 DaemonSets)
  POST /validate/evictions drain order (pods/eviction; pods DELETE when eviction.guardDeletes)
  POST /validate/noop     reads and checks an AdmissionReview like the others, then allows it with
                          no policy, no metrics and no log: the floor (HTTP + TLS + JSON) that
                          bench/ compares the policies against, and a connectivity check. The
                          chart never registers it.
  GET  /healthz           the process is alive (200 always while it serves)
  GET  /readyz            200 when the serving certificate is loaded and the caches have synced
  GET  /metrics           Prometheus metrics

A body that is not a usable AdmissionReview gets HTTP 400 with {"error": "..."}; every other
error is JSON too (404, 405, 500): never an HTML page, never a traceback.

A decision whose allow depends on a shared record (Decision.record: a driver pod leaving on the
strength of its Ready peer) is settled here, inside the review's deadline, by the `records`
writer (webhook.kube.records) before it is answered; then what the policy's `account` tallies of it
is counted (webhook.admission.record_tally).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webhook import admission, metrics
from webhook.config import Config
from webhook.model.facts import Facts
from webhook.model.leaving import LeaveRecord
from webhook.model.limits import over_limit
from webhook.policies import exceptions
from webhook.policies.decision import Decision
from webhook.policies.registry import POLICIES, Review, by_name
from webhook.serve.lanes import Lane, arrived, lanes_for

log = logging.getLogger("dra_guard.app")

#: The no-op admission endpoint: the benchmarks' floor (see the module docstring).
NOOP_PATH = "/validate/noop"
LARGE_REVIEW_BYTES = 256 * 1024  # bodies above this (or chunked) are judged one at a time per worker
#: writes a shared record before its deadline (time.monotonic()): (result, why), result one of
#: created, renewed, taken_over, conflict, error (webhook.kube.records.LeaseRecords.own)
Recorder = Callable[[LeaveRecord, float], tuple[str, str]]


@dataclasses.dataclass
class Readiness:
    """What /readyz reports. `certificate` is a callable returning (ok, reason) for the TLS files."""

    cluster: Facts
    certificate: Callable[[], tuple[bool, str]] = lambda: (True, "")
    draining: Callable[[], bool] = lambda: False

    def check(self) -> tuple[bool, list[str]]:
        """(ready, reasons it is not)."""
        reasons = ["shutting down (SIGTERM)"] if self.draining() else []
        ok, why = self.certificate()
        if not ok:
            reasons.append(why)
        ok, why = self.cluster.synced()
        if not ok:
            reasons.append(why)
        return not reasons, reasons


def policy_routes(config: Config, facts: Facts) -> dict[str, tuple[str, Callable[[Mapping[str, Any]], Decision]]]:
    """URL path -> (policy name, request -> Decision) for every policy in the registry, the config's
    exceptions applied (webhook.policies.exceptions) at the time of the review."""

    def bind(name: str, review: Review) -> Callable[[Mapping[str, Any]], Decision]:
        def evaluate(req: Mapping[str, Any]) -> Decision:
            decision = review(req, facts, config)
            if not config.exceptions or not decision.findings:
                return decision
            excepted, used, expired = exceptions.admit(decision, config.exceptions, now=datetime.datetime.now(datetime.UTC))
            if used:
                metrics.EXCEPTION_MATCHES.labels(policy=name, state="active").inc()
            if expired:
                metrics.EXCEPTION_MATCHES.labels(policy=name, state="expired").inc()
            for e in expired:
                log.warning(
                    "exception expired",
                    extra={
                        "policy": name,
                        "exception": e.ref,
                        "owner": e.owner,
                        "expires": e.expires.isoformat(),
                        "uid": req.get("uid"),
                    },
                )
            obj = req.get("object")
            if (
                name == "rbac"
                and excepted.allowed
                and not decision.allowed
                and req.get("dryRun") is not True
                and isinstance(obj, Mapping)
            ):
                # the RBAC guard dropped the object it refused from its pending record; allowed after
                # all, it goes back, so a concurrent review of its role sees it (webhook.model.pending)
                facts.rbac.pending.add(obj)
            return excepted

        return evaluate

    return {p.path: (p.name, bind(p.name, p.review)) for p in POLICIES}


def settled(decision: Decision, request: Mapping[str, Any], *, records: Recorder | None, deadline: float) -> Decision:
    """`decision` once its shared record is written (Decision.settle): a dry run, or no `records`
    (no Kubernetes API), writes nothing and keeps it as it is."""
    if decision.record is None:
        return decision
    if records is None or request.get("dryRun") is True:
        return decision.settle("unrecorded")
    return decision.settle(*records(decision.record.lease, deadline))


def create_app(*, config: Config, cluster: Facts, readiness: Readiness | None = None, records: Recorder | None = None) -> Flask:
    """Build the Flask app serving the admission endpoints of the registry for `config` over `cluster`'s facts
    (webhook.kube.state.ClusterState when serving). records: the shared-record writer (None: none
    is written, e.g. --no-cluster; each replica then guards surge pairs on its own)."""
    app = Flask("dra_guard")
    # one byte more than allowed: werkzeug caps a chunked body silently at this size, so reading
    # limit + 1 bytes tells a body over the limit from one exactly at it
    app.config["MAX_CONTENT_LENGTH"] = config.server.max_request_bytes + 1
    ready = readiness or Readiness(cluster=cluster)

    def read_review(path: str, *, peek: bool = False) -> dict[str, Any] | Response:
        """The request's AdmissionReview dict, or the 400 Response saying why there is none. peek:
        only apiVersion and request.uid are needed (an overload answer): read without parsing the
        whole body when they can be found at its start (admission.peek_review)."""
        mimetype = request.mimetype
        if mimetype != "application/json":
            return _bad_request(path, f"Content-Type must be application/json, got {mimetype or 'none'!r}")
        limit = config.server.max_request_bytes
        try:
            body = request.stream.read(limit + 1)  # chunked bodies have no Content-Length to check first
        except RequestEntityTooLarge:
            return _bad_request(path, f"body is larger than server.maxRequestBytes ({limit} bytes)")
        except Exception as exc:  # gunicorn raises its own errors for malformed chunked bodies
            return _bad_request(path, f"body could not be read: {type(exc).__name__}")
        if len(body) > limit:
            return _bad_request(path, f"body is larger than server.maxRequestBytes ({limit} bytes)")
        try:
            return (peek and admission.peek_review(body)) or admission.parse_review(body)
        except admission.BadRequest as exc:
            return _bad_request(path, str(exc))

    first = {p.name for p in POLICIES if p.first}
    lanes = lanes_for(config.server.threads, config.server.reserved_threads, first, [p.name for p in POLICIES])
    # one large review parsed and judged at a time per worker: a body of ~3-byte JSON values ({},{},..)
    # decodes to ~30x its size, and 8 bodies of 8 MiB at once took a worker past 1 GiB (an OOM kill
    # lets every eviction in flight through); small ones, evictions among them, never wait for it
    large = Lane("large", 1)
    limits = functools.partial(over_limit, limits=config.server)

    def make_view(path: str, policy: str, evaluate: Callable[[Mapping[str, Any]], Decision]) -> Callable[[], Response]:
        lane, settings, is_first = lanes[policy], config.policy(policy), policy in first
        account = by_name(policy).account
        # the policy's own deadline (the chart sets it from its webhook's timeoutSeconds), else the server's
        budget = settings.review_deadline_seconds or config.server.review_deadline_seconds
        budget_key = settings.deadline_key(policy)

        def view() -> Response:
            if on_probe_port():
                return _not_here()
            arrival = arrived(request.environ)
            try:
                return answer(arrival + budget)
            finally:
                metrics.REVIEW_AGE.labels(policy=policy).observe(time.monotonic() - arrival)

        def shed(cause: str, why: str) -> Response:
            """The overload answer, at once (reading only the body's head): never queue past the timeout."""
            review = read_review(path, peek=True)
            if isinstance(review, Response):
                return review
            return jsonify(
                admission.overload_answer(review, policy=policy, settings=settings, first=is_first, cause=cause, why=why)
            )

        def answer(deadline: float) -> Response:
            if time.monotonic() >= deadline:  # it waited (accept queue, worker queue) past its deadline
                return shed("deadline", f"overloaded: it waited in the queue past {budget_key}")
            if not lane.enter(deadline):
                return shed("overload", f"overloaded: its {lane.slots} server threads are busy")
            try:
                size = request.content_length
                if size is None or size > LARGE_REVIEW_BYTES:
                    if not large.enter(deadline):
                        return shed("overload", "overloaded: another large review is being judged")
                    try:
                        return judge(deadline)
                    finally:
                        large.leave()
                return judge(deadline)
            finally:
                lane.leave()

        def judge(deadline: float) -> Response:
            """The review read, parsed and judged by the policy (in the lane's threads, until `deadline`)."""
            review = read_review(path)
            if isinstance(review, Response):
                return review

            def final(req: Mapping[str, Any]) -> Decision:
                decision = settled(evaluate(req), req, records=records, deadline=deadline)
                if account is not None:
                    admission.record_tally(account(req, decision, cluster, mode=settings.mode))
                return decision

            def judged(req: Mapping[str, Any]) -> Decision:
                return lane.judge(final, req, deadline, deadline_key=budget_key)

            return jsonify(
                admission.respond(review, policy=policy, evaluate=judged, settings=settings, first=is_first, limits=limits)
            )

        view.__name__ = f"review_{policy}"
        view.lane = lane  # type: ignore[attr-defined]  # for tests and debugging: the lane it enters
        return view

    for path, (policy, evaluate) in policy_routes(config, cluster).items():
        app.add_url_rule(path, view_func=make_view(path, policy, evaluate), methods=["POST"])

    def on_probe_port() -> bool:
        """Whether this request came to server.probePort (no client certificate asked there)."""
        port = config.server.probe_port
        return bool(port) and request.environ.get("SERVER_PORT") == str(port)

    def noop() -> Response:
        if on_probe_port():
            return _not_here()
        review = read_review(NOOP_PATH)
        if isinstance(review, Response):
            return review
        return jsonify(
            {
                "apiVersion": review["apiVersion"],
                "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True},
            }
        )

    app.add_url_rule(NOOP_PATH, view_func=noop, methods=["POST"])

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify(status="ok")

    @app.get("/readyz")
    def readyz() -> tuple[Response, int]:
        ok, reasons = ready.check()
        return jsonify(ready=ok, reasons=reasons), 200 if ok else 503

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(), content_type=CONTENT_TYPE_LATEST)

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(_: RequestEntityTooLarge) -> Response:
        return _bad_request(request.path, f"body is larger than server.maxRequestBytes ({config.server.max_request_bytes} bytes)")

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[Response, int]:
        return jsonify(error=f"{exc.name}: {exc.description}"), exc.code or 500

    @app.errorhandler(Exception)
    def internal_error(exc: Exception) -> tuple[Response, int]:
        log.exception("unhandled error", extra={"path": request.path})
        return jsonify(error="internal error; see the dra-guard logs"), 500

    return app


def _bad_request(path: str, message: str) -> Response:
    metrics.BAD_REQUESTS.labels(path=path).inc()
    resp = jsonify(error=message)
    resp.status_code = 400
    return resp


def _not_here() -> Response:
    resp = jsonify(error="admission reviews are not served on server.probePort (it asks no client certificate)")
    resp.status_code = 403
    return resp
