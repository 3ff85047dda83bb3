"""Every review answered within its budget through the Flask app (no network):
size limits, selector values held as sets, the per-review deadline and the gate that decides it
(webhook.serve.lanes: a short queue for evictions), and the overload answer (eviction 429 retry,
never an allow).

Times: CPU time of this thread where the claim is about work (robust on a shared 2-core machine),
wall time only with generous bounds.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import threading
import time

import pytest

from tests.builders import binding, cluster_role, driver_daemonset, eviction_request, review, rule, subject
from webhook import admission
from webhook.config import ConfigError, from_mapping
from webhook.kube.state import ClusterState
from webhook.serve import app as app_module
from webhook.serve import lanes
from webhook.serve.app import create_app
from webhook.serve.front.wsgi import ARRIVAL

VALUES = 500_000


def heavy_role(values: int = VALUES) -> dict:
    role = cluster_role(
        "heavy",
        [rule(["resourceslices"], ["create"])],
        aggregation=[{"matchExpressions": [{"key": "k", "operator": "In", "values": [f"x{i}" for i in range(values)]}]}],
    )
    return role


def state_with_roles(n: int = 300) -> ClusterState:
    state = ClusterState(None)
    for i in range(n):
        state.rbac.upsert_role(cluster_role(f"r{i}", [rule(["resourceslices"], ["create"])], labels={"k": f"v{i}"}))
        state.rbac.upsert_binding(binding(f"b{i}", f"r{i}", [subject("Group", "g")]))
    return state


def client(state=None, **extra):
    return create_app(config=from_mapping(extra or None), cluster=state or ClusterState(None)).test_client()


def post(c, body, path="/validate/rbac"):
    return c.post(path, data=body if isinstance(body, bytes) else json.dumps(body), content_type="application/json")


# ------------------------------------------------------------------ a 500,000-value selector
def test_a_500000_value_selector_is_refused_by_the_limit_within_1_s():
    c = client(state_with_roles())
    body = json.dumps(review(heavy_role())).encode()
    assert len(body) > 5_000_000
    cpu, wall = time.thread_time(), time.monotonic()
    resp = post(c, body).get_json()["response"]
    cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
    assert resp["allowed"] is False and resp["status"]["code"] == 503
    assert "500001 aggregationRule label values" in resp["status"]["message"]
    assert "server.limits.maxSelectorValues" in resp["status"]["message"]
    assert cpu < 1.0 and wall < 5.0, (cpu, wall)


def test_a_500000_value_selector_under_a_raised_limit_is_judged_within_1_s():
    """The values are a set: matching 300 roles against it costs a lookup each (it was 22 s)."""
    state = state_with_roles()
    state.rbac.upsert_binding(binding("bound-heavy", "heavy", [subject("Group", "h")]))
    c = client(state, server={"limits": {"maxSelectorValues": 1_000_000}, "reviewDeadlineSeconds": 20})
    role = heavy_role()
    role["rules"] = []
    role["aggregationRule"]["clusterRoleSelectors"][0]["matchExpressions"][0]["values"].append("v7")
    body = json.dumps(review(role)).encode()
    cpu, wall = time.process_time(), time.monotonic()  # the judgment runs in the lane's thread
    resp = post(c, body).get_json()["response"]
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    # it aggregates r7's ResourceSlice write, and is bound to Group h: judged, and refused for that
    assert resp["allowed"] is False and resp["status"]["code"] == 403 and "Group h" in resp["status"]["message"]
    assert "aggregating r7" in resp["status"]["message"]
    assert cpu < 1.0 and wall < 5.0, (cpu, wall)


@pytest.mark.parametrize(
    "obj, path, what",
    [
        (cluster_role("many-rules", [rule(["pods"], ["get"])] * 2001), "/validate/rbac", "2001 rules"),
        (binding("many", "r0", [subject("Group", f"g{i}") for i in range(2001)]), "/validate/rbac", "2001 subjects"),
        (
            driver_daemonset(containers=[{"name": f"c{i}", "image": "x"} for i in range(201)]),
            "/mutate/daemonsets",
            "201 containers",
        ),
    ],
)
def test_objects_over_a_limit_are_not_judged_and_the_failure_mode_answers(obj, path, what):
    req = review(obj)
    if path == "/mutate/daemonsets":
        req["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "DaemonSet"}
    resp = post(client(), req, path).get_json()["response"]
    assert resp["uid"] == req["request"]["uid"]
    if path == "/validate/rbac":  # failureMode deny
        assert resp["allowed"] is False and resp["status"]["code"] == 503 and what in resp["status"]["message"]
    else:  # probes: failureMode allow, with a warning and no patch
        assert resp["allowed"] is True and "patch" not in resp and what in resp["warnings"][0]


def test_old_object_counts_too():
    old = binding("many", "r0", [subject("Group", f"g{i}") for i in range(2001)])
    resp = post(client(), review(binding("many", "r0", []), operation="UPDATE", old=old)).get_json()["response"]
    assert resp["allowed"] is False and "request.oldObject has 2001 subjects" in resp["status"]["message"]


# ------------------------------------------------------------------ the deadline
def slow_policies(monkeypatch, seconds: float, gate: threading.Event | None = None):
    """Every policy sleeps `seconds` (or waits for `gate`) before allowing."""
    from webhook.policies.decision import ALLOW

    def slow(request, facts, config):
        if gate is not None:
            gate.wait(seconds)
        else:
            time.sleep(seconds)
        return ALLOW

    monkeypatch.setattr(
        app_module,
        "POLICIES",
        tuple(dataclasses.replace(p, review=slow) if p.name != "eviction" or gate is None else p for p in app_module.POLICIES),
    )


@pytest.mark.parametrize(
    "path, body, code",
    [
        ("/validate/rbac", review(binding("b", "r0", [subject("Group", "g")])), 503),
        (
            "/validate/evictions",
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": eviction_request("gpu-driver-abc")},
            429,
        ),
    ],
)
def test_a_review_past_its_deadline_gets_the_overload_answer_never_an_allow(monkeypatch, path, body, code):
    """A judgment that ends after its deadline is answered with the overload answer, not with its
    late decision (the stand-in policy allows). Served, the front gives that answer at the deadline
    itself: tests/http/test_deadline.py."""
    slow_policies(monkeypatch, 0.6)
    c = client(server={"reviewDeadlineSeconds": 0.3})
    resp = post(c, body, path).get_json()["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == code, resp
    assert "reviewDeadlineSeconds" in resp["status"]["message"] and "retry" in resp["status"]["message"]


def test_the_eviction_failure_mode_allow_still_answers_429_when_not_judged(monkeypatch):
    slow_policies(monkeypatch, 0.6)
    c = client(server={"reviewDeadlineSeconds": 0.2}, policies={"eviction": {"failureMode": "allow"}})
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": eviction_request("p")}
    resp = post(c, body, "/validate/evictions").get_json()["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 429 and resp["status"]["reason"] == "TooManyRequests"


def test_a_policy_deadline_of_its_own_replaces_the_servers(monkeypatch):
    """policies.<name>.reviewDeadlineSeconds (the chart: that webhook's timeoutSeconds - 0.5): an RBAC
    webhook of 10 s lets a 0.6 s judgment finish where the server's 0.3 s would refuse it 503, while
    evictions keep the server's deadline; a policy deadline shorter than the server's is kept too."""
    slow_policies(monkeypatch, 0.6)
    c = client(server={"reviewDeadlineSeconds": 0.3}, policies={"rbac": {"reviewDeadlineSeconds": 5}})
    rbac = post(c, review(binding("b", "r0", [subject("Group", "g")]))).get_json()["response"]
    assert rbac["allowed"] is True, rbac  # judged: the slow stand-in policy allows
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": eviction_request("p")}
    eviction = post(c, body, "/validate/evictions").get_json()["response"]
    assert eviction["status"]["code"] == 429 and "server.reviewDeadlineSeconds" in eviction["status"]["message"]

    c = client(server={"reviewDeadlineSeconds": 5}, policies={"eviction": {"reviewDeadlineSeconds": 0.2}})
    eviction = post(c, body, "/validate/evictions").get_json()["response"]
    assert eviction["status"]["code"] == 429, eviction  # under the server's 5 s it would be judged: allowed
    assert "policies.eviction.reviewDeadlineSeconds" in eviction["status"]["message"]


def test_large_reviews_are_judged_one_at_a_time_and_small_ones_never_wait_for_them(monkeypatch):
    """docs/reliability.md, A3: bodies of ~3-byte JSON values decode to ~30x their size; 8 such 8 MiB
    reviews at once took a worker past 1 GiB (an OOM kill lets evictions in flight through). One
    review above LARGE_REVIEW_BYTES is parsed and judged at a time; a second one gets the overload
    answer at once (RBAC: 503); a small eviction meanwhile is judged as usual."""
    slow_policies(monkeypatch, 1.0)
    c = client(server={"reviewDeadlineSeconds": 5})
    padded = review(binding("b", "r0", [subject("Group", "g")]))
    padded["request"]["object"]["metadata"]["annotations"] = {"pad": "x" * (app_module.LARGE_REVIEW_BYTES + 1)}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, c, padded)
        time.sleep(0.3)  # the first one holds the large slot (its policy takes 1 s)
        second = post(c, padded).get_json()["response"]
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": eviction_request("p")}
        small = post(c, body, "/validate/evictions").get_json()["response"]
        assert first.result().get_json()["response"]["allowed"] is True  # judged: the stand-in policy allows
    assert second["allowed"] is False and second["status"]["code"] == 503
    assert "large review" in second["status"]["message"]
    assert small["allowed"] is True, small  # judged (the slow stand-in allows), not shed


# ------------------------------------------------------------------ the gate: may a review still be judged
def gate(path: str, **server) -> lanes.Gate:
    return lanes.gates(from_mapping({"server": {"reviewDeadlineSeconds": 1.0} | server}))[path]


def test_a_review_is_taken_while_what_is_queued_before_it_ends_by_its_deadline():
    """Gate.refusal (the front asks it on arrival, with its lane's queue and pace): None while the
    expected wait is shorter than what is left of the deadline; else the overload answer's cause and
    why; past its deadline, "deadline" whatever the queue."""
    rbac = gate("/validate/rbac")
    assert rbac.refusal(arrival=0.0, now=0.2, wait=0.7, queued=300, threads=8) is None  # a burst taken whole
    cause, why = rbac.refusal(arrival=0.0, now=0.2, wait=0.8, queued=300, threads=8)
    assert cause == "overload" and "300 reviews before it" in why and "server.reviewDeadlineSeconds" in why
    assert rbac.refusal(arrival=0.0, now=1.0)[0] == "deadline"


def test_evictions_queue_at_most_a_few_per_thread_then_get_429_at_once():
    """The eviction guard (Policy.first) is refused early, before its deadline is at risk: a short
    queue turns the apiserver's connections over fast (drains retry a 429); the other policies are not."""
    eviction, rbac = gate("/validate/evictions"), gate("/validate/rbac")
    limit = lanes.SHORT_QUEUE_PER_THREAD * 2
    assert eviction.refusal(arrival=0.0, now=0.0, queued=limit - 1, threads=2) is None
    assert eviction.refusal(arrival=0.0, now=0.0, queued=limit, threads=2)[0] == "overload"
    assert rbac.refusal(arrival=0.0, now=0.0, queued=limit, threads=2) is None
    answer = eviction.answer({"apiVersion": "admission.k8s.io/v1", "request": {"uid": "x"}}, ("overload", "overloaded"))
    assert answer["response"] == {
        "uid": "x",
        "allowed": False,
        "status": {
            "code": 429,
            "reason": "TooManyRequests",
            "status": "Failure",
            "message": "dra-guard did not judge this request (overloaded); retry",
        },
    }


def test_a_judgment_that_ends_past_its_deadline_is_not_the_answer():
    """Gate.judge judges in the calling thread; a decision reached after the deadline raises
    NotJudged (the front has answered the review at its deadline already)."""
    g = gate("/validate/evictions", reviewDeadlineSeconds=0.1)
    assert g.judge(lambda r: "decision", {}, time.monotonic()) == "decision"
    with pytest.raises(admission.NotJudged, match="not judged within server.reviewDeadlineSeconds"):
        g.judge(lambda r: time.sleep(0.2), {}, time.monotonic())


def test_work_whose_deadline_passed_before_its_judgment_began_is_not_run():
    ran = []
    with pytest.raises(admission.NotJudged, match="not judged within server.reviewDeadlineSeconds"):
        gate("/validate/evictions").judge(ran.append, {}, time.monotonic() - 1.0)
    assert ran == []


def test_server_reserved_threads_is_refused_at_start_up_with_what_became_of_it():
    """Evictions have threads of their own (the front's eviction lane): server.reservedThreads kept
    nothing, and a config that still sets it stops start-up naming it, never silently ignored."""
    with pytest.raises(ConfigError, match=r"server.reservedThreads: no longer a setting: .*remove it"):
        from_mapping({"server": {"threads": 4, "reservedThreads": 2}})


def test_peek_finds_uid_and_version_as_the_apiserver_writes_them_and_defers_otherwise():
    body = b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"705ab4f5-6393","kind":{}}}'
    assert admission.peek_review(body) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393"},
    }
    assert admission.peek_review(b'{"request":{"uid":"a"},"kind":"AdmissionReview"}') is None
    assert admission.peek_review(b'{"kind":"AdmissionReview","apiVersion":"v9","request":{"uid":"a"}}') is None


def test_a_review_that_arrives_past_its_deadline_is_answered_at_once_without_being_judged(monkeypatch):
    """Queued work older than its deadline is not served: the overload answer, from the body's head."""
    judged = []
    from webhook.policies.decision import ALLOW

    def policy(request, facts, config):
        judged.append(request)
        return ALLOW

    monkeypatch.setattr(app_module, "POLICIES", tuple(dataclasses.replace(p, review=policy) for p in app_module.POLICIES))
    c = client(server={"reviewDeadlineSeconds": 1})
    c.environ_base[ARRIVAL] = time.monotonic() - 2  # as the front passes a request queued 2 s ago
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": eviction_request("p")}
    resp = post(c, body, "/validate/evictions").get_json()["response"]
    rbac = post(c, review(binding("b", "r0", [subject("Group", "g")]))).get_json()["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 429 and "queue" in resp["status"]["message"]
    assert rbac["allowed"] is False and rbac["status"]["code"] == 503
    assert judged == []


def test_the_arrival_in_the_wsgi_environ_starts_the_reviews_deadline(monkeypatch):
    """The front passes a request's arrival as the WSGI environ key ARRIVAL (no
    thread-local): a review that arrived 2 s before its deadline of 1 s gets the overload answer
    unjudged; the same review arriving now is judged."""
    judged = []
    from webhook.policies.decision import ALLOW

    def policy(request, facts, config):
        judged.append(request)
        return ALLOW

    monkeypatch.setattr(app_module, "POLICIES", tuple(dataclasses.replace(p, review=policy) for p in app_module.POLICIES))
    c = client(server={"reviewDeadlineSeconds": 1})
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": eviction_request("p")})
    late = c.post(
        "/validate/evictions", data=body, content_type="application/json", environ_base={ARRIVAL: time.monotonic() - 2}
    ).get_json()["response"]
    assert late["allowed"] is False and late["status"]["code"] == 429 and judged == []
    fresh = c.post(
        "/validate/evictions", data=body, content_type="application/json", environ_base={ARRIVAL: time.monotonic()}
    ).get_json()["response"]
    assert fresh["allowed"] is True and len(judged) == 1


def test_the_fronts_overload_answer_is_made_from_the_bodys_head_without_the_app():
    """lanes.gates: the answer the event-loop front gives on its loop to a review past its
    deadline or refused on arrival: the policy's failure mode (eviction 429 retry, RBAC 503) for
    the request's uid, read from the head of a body as the apiserver writes it; None for a body
    that does not start that way (the app answers it, e.g. with a 400)."""
    shed = lanes.gates(from_mapping({"server": {"reviewDeadlineSeconds": 1.5}}))
    eviction, rbac = shed["/validate/evictions"], shed["/validate/rbac"]
    assert eviction.budget == 1.5 and eviction.budget_key == "server.reviewDeadlineSeconds"
    body = json.dumps(
        {
            "kind": "AdmissionReview",
            "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "u-1", **{k: v for k, v in eviction_request("p").items() if k != "uid"}},
        }
    ).encode()
    answer = json.loads(eviction.answer_bytes(body, ("overload", "overloaded: test"), arrival=time.monotonic()))
    assert answer["response"]["uid"] == "u-1" and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 429
    assert json.loads(rbac.answer_bytes(body, ("deadline", "w"), arrival=time.monotonic()))["response"]["status"]["code"] == 503
    odd = b'{"request": {"uid": "x"}, "kind": "AdmissionReview"}'
    assert eviction.answer_bytes(odd, ("overload", "w"), arrival=0.0) is None
