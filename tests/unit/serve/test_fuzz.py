"""Property-based fuzzing of the admission endpoints and the policies (hypothesis).

Every answer must be HTTP 400 with a JSON {"error"} or HTTP 200 with a well-formed AdmissionReview
echoing apiVersion, kind and uid; warnings under 120 characters; patch and patchType together,
the patch add-only and applicable to the object. No 5xx, no exception, no policy error.

CI runs a short budget; the long run (documented in docs/reliability.md) is
    DRA_GUARD_FUZZ_EXAMPLES=100000 python -m pytest tests/unit/serve/test_fuzz.py -q
"""

from __future__ import annotations

import base64
import copy
import json
import os

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import (
    binding,
    claim,
    cluster_role,
    driver_daemonset,
    eviction_request,
    plugin_container,
    pod,
    review,
    rule,
    subject,
)
from webhook import metrics
from webhook.config import from_mapping
from webhook.kube.state import ClusterState
from webhook.serve.app import create_app

EXAMPLES = int(os.environ.get("DRA_GUARD_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def make_client():
    state = ClusterState(None)
    state.rbac.upsert_role(cluster_role("everything", [rule(["*"], ["*"], groups=["*"])]))
    state.rbac.upsert_role(cluster_role("edit", [], aggregation=[{"matchLabels": {"agg": "true"}}]))
    state.rbac.upsert_binding(binding("devs-edit", "edit", [subject("Group", "devs")]))
    state.claims.upsert_daemonset(driver_daemonset(name="gpu-driver", namespace="gpu"))
    state.claims.upsert_pod(pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"))
    state.claims.upsert_pod(pod("consumer", "node-a"))
    state.claims.upsert_claim(claim("gpu"))
    return create_app(config=from_mapping({"server": {"maxRequestBytes": 256 * 1024}}), cluster=state).test_client()


CLIENT = make_client()


def _ds_review():
    body = review(binding("x", "y", []))
    body["request"].update(
        kind={"group": "apps", "version": "v1", "kind": "DaemonSet"},
        resource={"group": "apps", "version": "v1", "resource": "daemonsets"},
        object=driver_daemonset(containers=[plugin_container("a", args=["--healthcheck-port=1"]), plugin_container("b")]),
    )
    return body


SEEDS = {
    "/validate/rbac": [
        review(binding("b", "everything", [subject("Group", "team-a")])),
        review(cluster_role("m", [rule(["resourceslices"], ["patch"])], labels={"agg": "true"})),
        review(binding("b", "everything", [subject("Group", "team-a")], kind="RoleBinding", namespace="n")),
    ],
    "/mutate/daemonsets": [_ds_review()],
    "/validate/evictions": [
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": eviction_request("gpu-driver-a")}
    ],
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=25,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_reviews(draw):
    path = draw(st.sampled_from(sorted(SEEDS)))
    body = copy.deepcopy(draw(st.sampled_from(SEEDS[path])))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(body) if p]
        if not paths:
            break
        target = draw(st.sampled_from(paths))
        parent = body
        for key in target[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "null", "wrap"]))
        key = target[-1]
        if action == "replace":
            parent[key] = draw(json_values)
        elif action == "delete":
            if isinstance(parent, dict):
                del parent[key]
            else:
                parent.pop(key)
        elif action == "null":
            parent[key] = None
        else:
            parent[key] = [parent[key]]
    return path, body


def check_answer(rv, body):
    assert rv.status_code in (200, 400), (rv.status_code, rv.get_data()[:300])
    assert rv.is_json
    out = rv.get_json()
    if rv.status_code == 400:
        assert isinstance(out.get("error"), str) and out["error"]
        return
    assert out["kind"] == "AdmissionReview" and out["apiVersion"] == body["apiVersion"]
    resp = out["response"]
    assert resp["uid"] == body["request"]["uid"]
    assert isinstance(resp["allowed"], bool)
    for w in resp.get("warnings", []):
        assert isinstance(w, str) and len(w) < 120
        assert "internal error" not in w, w  # a policy must not fail on any input
    if not resp["allowed"]:
        assert resp["status"]["code"] in (403, 429), resp["status"]
    assert ("patch" in resp) == ("patchType" in resp)
    if "patch" in resp:
        ops = json.loads(base64.b64decode(resp["patch"]))
        assert all(op["op"] == "add" for op in ops)
        jsonpatch.apply_patch(body["request"]["object"], ops)


@FUZZ
@given(mutated_reviews())
def test_mutated_reviews_get_a_well_formed_answer(case):
    path, body = case
    before = metrics.POLICY_ERRORS.labels(
        policy={"/validate/rbac": "rbac", "/mutate/daemonsets": "probes", "/validate/evictions": "eviction"}[path]
    )._value.get()
    rv = CLIENT.post(path, data=json.dumps(body), content_type="application/json")
    check_answer(rv, body)
    after = metrics.POLICY_ERRORS.labels(
        policy={"/validate/rbac": "rbac", "/mutate/daemonsets": "probes", "/validate/evictions": "eviction"}[path]
    )._value.get()
    assert after == before, "a policy raised"


@FUZZ
@given(st.sampled_from(sorted(SEEDS)), json_values)
def test_random_json_bodies(path, value):
    rv = CLIENT.post(path, data=json.dumps(value), content_type="application/json")
    assert rv.status_code in (200, 400) and rv.is_json
    if rv.status_code == 200:
        check_answer(rv, value)


@FUZZ
@given(st.sampled_from(sorted(SEEDS)), st.binary(max_size=300), st.sampled_from(["application/json", "text/plain", ""]))
def test_random_bytes_and_content_types(path, data, content_type):
    rv = CLIENT.post(path, data=data, content_type=content_type)
    assert rv.status_code == 400 and rv.is_json and rv.get_json()["error"]


@FUZZ
@given(st.sampled_from(sorted(SEEDS)), st.integers(1, 2000))
def test_truncated_bodies(path, cut):
    raw = json.dumps(SEEDS[path][0]).encode()
    rv = CLIENT.post(path, data=raw[: min(cut, len(raw) - 1)], content_type="application/json")
    assert rv.status_code == 400 and rv.is_json


@pytest.mark.parametrize("depth", [100, 900, 5000, 100_000])
def test_deep_nesting(depth):
    body = copy.deepcopy(SEEDS["/mutate/daemonsets"][0])
    body["request"]["object"]["spec"]["x"] = json.loads("[" * min(depth, 900) + "]" * min(depth, 900))
    raw = json.dumps(body).encode() if depth <= 900 else b'{"a":' + b"[" * depth + b"]" * depth + b"}"
    rv = CLIENT.post("/mutate/daemonsets", data=raw, content_type="application/json")
    assert rv.status_code in (200, 400) and rv.is_json


def test_huge_arrays_and_duplicate_keys():
    body = copy.deepcopy(SEEDS["/validate/rbac"][0])
    body["request"]["object"]["subjects"] = [{"kind": "Group", "name": f"g{i}"} for i in range(3000)]
    rv = CLIENT.post("/validate/rbac", data=json.dumps(body), content_type="application/json")
    assert rv.status_code == 200 and rv.get_json()["response"]["allowed"] is False
    raw = json.dumps(SEEDS["/validate/rbac"][0])[:-1] + ', "kind": "NotAReview"}'
    rv = CLIENT.post("/validate/rbac", data=raw, content_type="application/json")
    assert rv.status_code == 400  # the last duplicate wins, as in Go's encoding/json
