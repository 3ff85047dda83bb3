"""A review still being judged at its deadline: the front answers it then, with the overload answer
(an eviction 429 "retry", an RBAC write its failure mode, 503), never an allow, and the judgment's
own answer, once it ends, is dropped; the connection serves its next review as usual.

The judgment runs in the thread the front handed the review to (no second thread per review), so
no thread of the app can answer at the deadline: the front does, on its loop. These tests run the
real front (uvloop, TLS, the lanes' executors, webhook.serve.front.make_front) and the real Flask
app in this process, with a stand-in policy that holds its judgment until the test lets it end.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest
from prometheus_client import REGISTRY

from tests import builders
from tests.builders import eviction_request
from tests.http.clients import answer, apiserver_post, connect, read_response
from tests.http.inprocess import serving
from webhook.config import from_mapping
from webhook.kube.state import ClusterState
from webhook.serve import app as app_module

DEADLINE = 0.5  # seconds: server.reviewDeadlineSeconds of these tests


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    "path, request_, policy, code",
    [
        ("/validate/evictions", eviction_request("gpu-driver-x"), "eviction", 429),
        (
            "/validate/rbac",
            builders.review(builders.binding("b", "r0", [builders.subject("Group", "g")]))["request"],
            "rbac",
            503,
        ),
    ],
)
def test_a_review_still_judged_at_its_deadline_is_answered_then_by_the_front_never_allowed(
    tmp_path, held, path, request_, policy, code
):
    running, release, ended = held
    config = from_mapping({"server": {"reviewDeadlineSeconds": DEADLINE}})
    app = app_module.create_app(config=config, cluster=ClusterState(None))
    not_judged = sample("dra_guard_reviews_not_judged_total", policy=policy, cause="deadline")
    ages = sample("dra_guard_review_age_seconds_count", policy=policy)
    with serving(app, config, tmp_path) as served, contextlib.closing(connect(served)) as tls:
        started = time.monotonic()
        tls.sendall(apiserver_post(path, request_, "late-1"))
        response = answer(tls)["response"]
        answered_after = time.monotonic() - started
        # answered while the judgment still runs: the app could not have answered yet
        assert running.is_set() and not ended.is_set()
        assert response["uid"] == "late-1" and response["allowed"] is False, response
        assert response["status"]["code"] == code
        assert "not judged within server.reviewDeadlineSeconds" in response["status"]["message"]
        assert answered_after >= DEADLINE, answered_after  # at the deadline (not when released: see above)
        release.set()
        assert ended.wait(5)
        # the same connection: the next review is answered by its own judgment, not by the late one
        tls.sendall(apiserver_post(path, request_, "next-2"))
        following = answer(tls)["response"]
        assert following == {"uid": "next-2", "allowed": True}, following
    # counted once each: not judged when the late judgment ended, its age with the front's answer
    deadline = time.monotonic() + 5
    while (
        sample("dra_guard_reviews_not_judged_total", policy=policy, cause="deadline") == not_judged
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    time.sleep(0.2)  # the late judgment's view ends right after it counted (where a wrong age would be observed)
    assert sample("dra_guard_reviews_not_judged_total", policy=policy, cause="deadline") == not_judged + 1
    assert sample("dra_guard_review_age_seconds_count", policy=policy) == ages + 2


def test_a_body_the_overload_answer_cannot_be_made_from_waits_for_the_app(tmp_path, held):
    """A review not written as the kube-apiserver writes it (kind, apiVersion and request.uid first) has no overload answer
    without parsing it: the front leaves it to the app, which answers it once its judgment ends (with
    the overload answer: it ended past its deadline)."""
    running, release, ended = held
    config = from_mapping({"server": {"reviewDeadlineSeconds": DEADLINE}})
    app = app_module.create_app(config=config, cluster=ClusterState(None))
    body = json.dumps(
        {"request": dict(eviction_request("p"), uid="odd"), "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}
    )
    raw = (
        f"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        + body
    ).encode()
    with serving(app, config, tmp_path) as served, contextlib.closing(connect(served)) as tls:
        tls.sendall(raw)
        assert running.wait(5)
        time.sleep(2 * DEADLINE)
        release.set()
        response = answer(tls)["response"]
    assert ended.is_set()
    assert response["uid"] == "odd" and response["allowed"] is False and response["status"]["code"] == 429, response


def test_an_app_that_raises_in_its_thread_gets_a_json_500_and_its_lane_is_freed(tmp_path):
    """The lane's thread hands an exception back to the loop like an answer: the client gets a JSON
    500 (never a hang), and the lane counts the review as finished, so the failures do not pile up
    into a queue that refuses the reviews after them as overload (more failures than the eviction
    lane's short queue holds, then a review that must be judged)."""
    config = from_mapping({"server": {"reviewDeadlineSeconds": 5}})
    flask_app = app_module.create_app(config=config, cluster=ClusterState(None))

    def failing(environ, start_response):
        if environ.get("HTTP_X_FAIL"):
            raise RuntimeError("a WSGI app that raises past Flask")
        return flask_app(environ, start_response)

    failures = 4 * config.server.threads + 8  # past the eviction lane's short queue (lanes.SHORT_QUEUE_PER_THREAD)
    with serving(failing, config, tmp_path) as served:
        for i in range(failures):
            with contextlib.closing(connect(served)) as tls:
                post = apiserver_post("/validate/evictions", eviction_request("gpu-driver-x"), f"fail-{i}")
                tls.sendall(post.replace(b"Host: x\r\n", b"Host: x\r\nX-Fail: 1\r\n"))
                head, body = read_response(tls)
                assert head.startswith(b"HTTP/1.1 500 ") and "error" in json.loads(body), (head, body)
        with contextlib.closing(connect(served)) as tls:
            tls.sendall(apiserver_post("/validate/evictions", eviction_request("gpu-driver-x"), "after"))
            assert answer(tls)["response"] == {"uid": "after", "allowed": True}
