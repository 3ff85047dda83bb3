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

Each route is a small object built by create_app: a PolicyRoute per policy of the registry (its
review wrapped in ExceptedReview, judged under its gate: webhook.serve.lanes.Gate decides whether
it may still be judged and builds the overload answer if not), NoopRoute, Readiness.view; Reader
reads and checks the request's body for them.

A body that is not a usable AdmissionReview gets HTTP 400 with {"error": "..."}; every other
error is JSON too (404, 405, 500): never an HTML page, never a traceback.

A decision whose allow depends on a shared record (Decision.record: a driver pod leaving on the
strength of its Ready peer) is settled here, inside the review's deadline, by the `records`
writer (webhook.kube.records) before it is answered; then what the policy's `account` tallies of it
is counted (webhook.admission.record_tally).
"""

from __future__ import annotations

import contextlib
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
from webhook.model.pending import PendingFull
from webhook.policies import exceptions
from webhook.policies.decision import Decision
from webhook.policies.registry import POLICIES, Review, by_name
from webhook.serve.front.wsgi import ANSWERED
from webhook.serve.lanes import Gate, LargeSlot, Refusal, arrived, gates

log = logging.getLogger("dra_guard.app")

#: The no-op admission endpoint: the benchmarks' floor (see the module docstring).
NOOP_PATH = "/validate/noop"
LARGE_REVIEW_BYTES = 256 * 1024  # bodies above this are judged one at a time per worker
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

    def view(self) -> tuple[Response, int]:
        """GET /readyz: {"ready": bool, "reasons": [...]}, 200 when ready, else 503."""
        ok, reasons = self.check()
        return jsonify(ready=ok, reasons=reasons), 200 if ok else 503


class ExceptedReview:
    """A policy's review with the config's exceptions applied (webhook.policies.exceptions) at the
    time of the review: request dict -> Decision. Counts and logs the exceptions it used."""

    def __init__(self, name: str, review: Review, config: Config, facts: Facts) -> None:
        self.name, self.review, self.config, self.facts = name, review, config, facts

    def __call__(self, req: Mapping[str, Any]) -> Decision:
        decision = self.review(req, self.facts, self.config)
        if not self.config.exceptions or not decision.findings:
            return decision
        excepted, used, expired = exceptions.admit(decision, self.config.exceptions, now=datetime.datetime.now(datetime.UTC))
        if used:
            metrics.EXCEPTION_MATCHES.labels(policy=self.name, state="active").inc()
        if expired:
            metrics.EXCEPTION_MATCHES.labels(policy=self.name, state="expired").inc()
        for e in expired:
            log.warning(
                "exception expired",
                extra={
                    "policy": self.name,
                    "exception": e.ref,
                    "owner": e.owner,
                    "expires": e.expires.isoformat(),
                    "uid": req.get("uid"),
                },
            )
        obj = req.get("object")
        if (
            self.name == "rbac"
            and excepted.allowed
            and not decision.allowed
            and req.get("dryRun") is not True
            and isinstance(obj, Mapping)
        ):
            # the RBAC guard dropped the object it refused from its pending record; allowed after
            # all, it goes back, so a concurrent review of its role sees it (webhook.model.pending);
            # with the records full (a flood), the watch re-judging covers it as it does across replicas
            with contextlib.suppress(PendingFull):
                self.facts.rbac.pending.add(obj)
        return excepted


def policy_routes(config: Config, facts: Facts) -> dict[str, tuple[str, Callable[[Mapping[str, Any]], Decision]]]:
    """URL path -> (policy name, request -> Decision) for every policy in the registry, the config's
    exceptions applied (ExceptedReview) at the time of the review."""
    return {p.path: (p.name, ExceptedReview(p.name, p.review, config, facts)) for p in POLICIES}


def settled(decision: Decision, request: Mapping[str, Any], *, records: Recorder | None, deadline: float) -> Decision:
    """`decision` once its shared record is written (Decision.settle): a dry run, or no `records`
    (no Kubernetes API), writes nothing and keeps it as it is."""
    if decision.record is None:
        return decision
    if records is None or request.get("dryRun") is True:
        return decision.settle("unrecorded")
    return decision.settle(*records(decision.record.lease, deadline))


class Reader:
    """Reads the current request (flask.request) for the admission routes, under `config.server`."""

    def __init__(self, config: Config) -> None:
        self.server = config.server

    def on_probe_port(self) -> bool:
        """Whether this request came to server.probePort (no client certificate asked there)."""
        port = self.server.probe_port
        return bool(port) and request.environ.get("SERVER_PORT") == str(port)

    def review(self, path: str, *, peek: bool = False) -> dict[str, Any] | Response:
        """The request's AdmissionReview dict, or the 400 Response saying why there is none. peek:
        only apiVersion and request.uid are needed (an overload answer): read without parsing the
        whole body when they can be found at its start (admission.peek_review)."""
        mimetype = request.mimetype
        if mimetype != "application/json":
            return _bad_request(path, f"Content-Type must be application/json, got {mimetype or 'none'!r}")
        try:
            # the front hands the whole body with its Content-Length (a chunked one is refused 411
            # there); werkzeug refuses a Content-Length over MAX_CONTENT_LENGTH before reading
            body = request.stream.read()
        except RequestEntityTooLarge:
            return self.too_large()
        try:
            return (peek and admission.peek_review(body)) or admission.parse_review(body)
        except admission.BadRequest as exc:
            return _bad_request(path, str(exc))

    def too_large(self, _: RequestEntityTooLarge | None = None) -> Response:
        """The 400 answer to a body over server.maxRequestBytes (also werkzeug's error handler)."""
        return _bad_request(request.path, f"body is larger than server.maxRequestBytes ({self.server.max_request_bytes} bytes)")


class PolicyRoute:
    """The view of one policy's admission endpoint (POST `path`): the review is read, judged by
    `evaluate` in this thread, its shared record settled and its Tally counted, unless its `gate`
    says it may no longer be judged (its deadline passed while it waited for this thread) or,
    when large, the worker's one large slot stays taken: then it gets the gate's overload answer.
    One still being judged at its deadline is answered by the front (webhook.serve.lanes)."""

    def __init__(
        self,
        path: str,
        evaluate: Callable[[Mapping[str, Any]], Decision],
        *,
        gate: Gate,
        cluster: Facts,
        large: LargeSlot,
        limits: Callable[[Mapping[str, Any]], str | None],
        reader: Reader,
        records: Recorder | None,
    ) -> None:
        self.path, self.evaluate, self.gate = path, evaluate, gate
        self.cluster, self.records, self.reader, self.large, self.limits = cluster, records, reader, large, limits
        self.policy, self.settings = gate.policy, gate.settings
        self.account = by_name(gate.policy).account
        self.age = metrics.REVIEW_AGE.labels(policy=gate.policy)
        self.__name__ = f"review_{gate.policy}"

    def __call__(self) -> Response:
        if self.reader.on_probe_port():
            return _not_here()
        arrival = arrived(request.environ)
        try:
            return self.answer(arrival)
        finally:
            if not request.environ.get(ANSWERED):  # else the front observed it with its answer at the deadline
                self.age.observe(time.monotonic() - arrival)

    def shed(self, refusal: Refusal) -> Response:
        """The gate's overload answer, at once (reading only the body's head): never queue past the timeout."""
        review = self.reader.review(self.path, peek=True)
        if isinstance(review, Response):
            return review
        return jsonify(self.gate.answer(review, refusal))

    def answer(self, arrival: float) -> Response:
        """The answer to the review that arrived at `arrival` (time.monotonic()), judged in this thread or shed."""
        refusal = self.gate.refusal(arrival=arrival, now=time.monotonic())
        if refusal is not None:  # it waited (accept queue, its lane's queue) past its deadline
            return self.shed(refusal)
        if (request.content_length or 0) <= LARGE_REVIEW_BYTES:
            return self.judge(arrival)
        if not self.large.enter(arrival + self.gate.budget):
            return self.shed(LargeSlot.REFUSAL)
        try:
            return self.judge(arrival)
        finally:
            self.large.leave()

    def judge(self, arrival: float) -> Response:
        """The review read, parsed and judged by the policy (in this thread, by the gate's deadline)."""
        review = self.reader.review(self.path)
        if isinstance(review, Response):
            return review
        deadline = arrival + self.gate.budget

        def judged(req: Mapping[str, Any]) -> Decision:
            return self.gate.judge(functools.partial(self.final, deadline=deadline), req, arrival)

        return jsonify(
            admission.respond(
                review, policy=self.policy, evaluate=judged, settings=self.settings, first=self.gate.first, limits=self.limits
            )
        )

    def final(self, req: Mapping[str, Any], *, deadline: float) -> Decision:
        """The policy's decision on `req` once its shared record is settled (by `deadline`,
        time.monotonic()), its Tally counted."""
        decision = settled(self.evaluate(req), req, records=self.records, deadline=deadline)
        if self.account is not None:
            admission.record_tally(self.account(req, decision, self.cluster, mode=self.settings.mode))
        return decision


class NoopRoute:
    """POST NOOP_PATH: reads and checks an AdmissionReview, then allows it (the benchmarks' floor)."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.__name__ = "noop"

    def __call__(self) -> Response:
        if self.reader.on_probe_port():
            return _not_here()
        review = self.reader.review(NOOP_PATH)
        if isinstance(review, Response):
            return review
        return jsonify(
            {
                "apiVersion": review["apiVersion"],
                "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True},
            }
        )


def create_app(*, config: Config, cluster: Facts, readiness: Readiness | None = None, records: Recorder | None = None) -> Flask:
    """Build the Flask app serving the admission endpoints of the registry for `config` over `cluster`'s facts
    (webhook.kube.state.ClusterState when serving). records: the shared-record writer (None: none
    is written, e.g. --no-cluster; each replica then guards surge pairs on its own)."""
    app = Flask("dra_guard")
    app.config["MAX_CONTENT_LENGTH"] = config.server.max_request_bytes
    # every answer goes through jsonify: its keys need no sorting (the apiserver reads fields by
    # name) and no indentation (Flask's public JSON provider settings; its default sorts them)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.json.compact = True  # type: ignore[attr-defined]
    reader = Reader(config)
    large = LargeSlot()
    limits = functools.partial(over_limit, limits=config.server)
    gate_of = gates(config)
    for path, (_, evaluate) in policy_routes(config, cluster).items():
        route = PolicyRoute(
            path, evaluate, gate=gate_of[path], cluster=cluster, large=large, limits=limits, reader=reader, records=records
        )
        app.add_url_rule(path, endpoint=route.__name__, view_func=route, methods=["POST"])
    app.add_url_rule(NOOP_PATH, endpoint="noop", view_func=NoopRoute(reader), methods=["POST"])
    app.add_url_rule("/healthz", endpoint="healthz", view_func=_healthz, methods=["GET"])
    app.add_url_rule("/readyz", endpoint="readyz", view_func=(readiness or Readiness(cluster=cluster)).view, methods=["GET"])
    app.add_url_rule("/metrics", endpoint="prometheus", view_func=_prometheus, methods=["GET"])
    app.register_error_handler(RequestEntityTooLarge, reader.too_large)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _internal_error)
    return app


def _healthz() -> Response:
    return jsonify(status="ok")


def _prometheus() -> Response:
    return Response(generate_latest(), content_type=CONTENT_TYPE_LATEST)


def _http_error(exc: HTTPException) -> tuple[Response, int]:
    return jsonify(error=f"{exc.name}: {exc.description}"), exc.code or 500


def _internal_error(exc: Exception) -> tuple[Response, int]:
    log.exception("unhandled error", extra={"path": request.path})
    return jsonify(error="internal error; see the dra-guard logs"), 500


def _bad_request(path: str, message: str) -> Response:
    metrics.BAD_REQUESTS.labels(path=path).inc()
    resp = jsonify(error=message)
    resp.status_code = 400
    return resp


def _not_here() -> Response:
    resp = jsonify(error="admission reviews are not served on server.probePort (it asks no client certificate)")
    resp.status_code = 403
    return resp
