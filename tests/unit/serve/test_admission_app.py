"""Envelope handling and the Flask app (app.test_client, no network): modes, dry run, bad input."""

from __future__ import annotations

import base64
import json

import pytest

from tests.builders import binding, cluster_role, review, rule, subject
from webhook import admission
from webhook.config import PolicyConfig, from_mapping
from webhook.kube.state import ClusterState
from webhook.policies.decision import Decision, Finding
from webhook.serve.app import create_app

WILDCARD = rule(["*"], ["*"], groups=["*"])


def make_client(mode="enforce", **extra):
    config = from_mapping({"mode": mode, **extra})
    state = ClusterState(None)
    state.rbac.upsert_role(cluster_role("everything", [WILDCARD]))
    return create_app(config=config, cluster=state).test_client()


def post(client, body, path="/validate/rbac", content_type="application/json"):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(path, data=data, content_type=content_type)


BAD_BINDING = binding("team-gpu", "everything", [subject("Group", "team-a")])


def test_enforce_refuses_with_403_naming_the_group():
    rv = post(make_client("enforce"), review(BAD_BINDING))
    assert rv.status_code == 200
    resp = rv.get_json()["response"]
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 403
    assert "team-a" in resp["status"]["message"]
    assert resp["auditAnnotations"]["rbac-mode"] == "enforce"


def test_warn_allows_with_a_short_warning():
    resp = post(make_client("warn"), review(BAD_BINDING)).get_json()["response"]
    assert resp["allowed"] is True
    assert resp["warnings"] and all(len(w) < 120 for w in resp["warnings"])
    assert any("team-a" in w for w in resp["warnings"])
    assert "status" not in resp


def test_audit_allows_silently_and_records():
    from prometheus_client import REGISTRY

    before = REGISTRY.get_sample_value("dra_guard_admission_violations_total", {"policy": "rbac", "mode": "audit"}) or 0
    resp = post(make_client("audit"), review(BAD_BINDING)).get_json()["response"]
    assert resp["allowed"] is True
    assert "warnings" not in resp
    assert "team-a" in resp["auditAnnotations"]["rbac-finding"]
    assert REGISTRY.get_sample_value("dra_guard_admission_violations_total", {"policy": "rbac", "mode": "audit"}) == before + 1


def test_per_policy_mode_overrides_global():
    resp = post(make_client("enforce", policies={"rbac": {"mode": "warn"}}), review(BAD_BINDING)).get_json()["response"]
    assert resp["allowed"] is True and resp["warnings"]


def test_rolebinding_to_a_wide_role_is_refused_for_device_allocation_only():
    rb = binding("ns", "everything", [subject("Group", "team-a")], kind="RoleBinding", namespace="team-a")
    resp = post(make_client(), review(rb)).get_json()["response"]
    assert resp["allowed"] is False and "resourceclaims/" in resp["status"]["message"]
    assert "deviceclasses" not in resp["status"]["message"]  # a RoleBinding grants no cluster-scoped write


def test_dry_run_gets_the_same_answer():
    client = make_client()
    a = post(client, review(BAD_BINDING))
    b = post(client, review(BAD_BINDING, dry_run=True))
    ra, rb = a.get_json()["response"], b.get_json()["response"]
    ra.pop("uid"), rb.pop("uid")
    assert ra == rb


@pytest.mark.parametrize("api_version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
def test_envelope_is_echoed(api_version):
    req = review(BAD_BINDING, api_version=api_version)
    out = post(make_client(), req).get_json()
    assert out["apiVersion"] == api_version
    assert out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == req["request"]["uid"]


def test_delete_with_null_object_is_allowed():
    resp = post(make_client(), review(None, old=BAD_BINDING, operation="DELETE")).get_json()["response"]
    assert resp["allowed"] is True


def test_connect_is_allowed():
    req = review(BAD_BINDING, operation="CONNECT")
    assert post(make_client(), req).get_json()["response"]["allowed"] is True


def _envelope(**overrides):
    body = review(BAD_BINDING)
    body.update(overrides)
    return body


@pytest.mark.parametrize(
    "name, body, content_type, needle",
    [
        ("not json", b"{nope", "application/json", "not valid JSON"),
        ("json array", b"[]", "application/json", "JSON object"),
        ("not an AdmissionReview", {"kind": "Pod", "apiVersion": "v1"}, "application/json", "kind must be AdmissionReview"),
        ("unknown apiVersion", _envelope(apiVersion="admission.k8s.io/v2"), "application/json", "apiVersion must be"),
        (
            "no request",
            {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"},
            "application/json",
            "request is missing",
        ),
        (
            "no uid",
            {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"operation": "CREATE"}},
            "application/json",
            "request.uid",
        ),
        ("empty body", b"", "application/json", "not valid JSON"),
        ("wrong content type", review(BAD_BINDING), "text/plain", "Content-Type"),
        ("invalid utf-8", b"\xff\xfe{", "application/json", "not valid JSON"),
    ],
)
def test_bad_input_gets_400_json(name, body, content_type, needle):
    rv = post(make_client(), body, content_type=content_type)
    assert rv.status_code == 400, name
    assert rv.is_json
    assert needle in rv.get_json()["error"], name


def test_body_over_the_limit_gets_400_json():
    client = make_client(server={"maxRequestBytes": 2048})
    body = review(BAD_BINDING)
    body["request"]["object"]["metadata"]["annotations"] = {"x": "y" * 4096}
    rv = post(client, body)
    assert rv.status_code == 400
    assert "maxRequestBytes" in rv.get_json()["error"]


@pytest.mark.parametrize("path, method", [("/nope", "get"), ("/validate/rbac", "get"), ("/healthz", "post")])
def test_routing_errors_are_json(path, method):
    rv = getattr(make_client(), method)(path)
    assert rv.status_code in (404, 405)
    assert rv.is_json and "error" in rv.get_json()


def test_health_ready_and_metrics():
    client = make_client()
    assert client.get("/healthz").get_json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200  # --no-cluster: nothing to sync
    post(client, review(BAD_BINDING))
    text = client.get("/metrics").get_data(as_text=True)
    assert 'dra_guard_admission_requests_total{decision="deny",mode="enforce",operation="CREATE",policy="rbac"}' in text
    assert "dra_guard_admission_duration_seconds_bucket" in text and 'le="10.0"' in text


# ------------------------------------------------------------------ admission.respond directly
def _boom(_request):
    raise RuntimeError("secret detail that must not leak")


@pytest.mark.parametrize("failure_mode, allowed", [("deny", False), ("allow", True)])
def test_policy_exception_answers_failure_mode_without_leaking(failure_mode, allowed, caplog):
    req = review(BAD_BINDING)
    out = admission.respond(req, policy="rbac", evaluate=_boom, settings=PolicyConfig(mode="enforce", failure_mode=failure_mode))
    resp = out["response"]
    assert resp["allowed"] is allowed
    assert resp["uid"] == req["request"]["uid"]
    assert "secret detail" not in json.dumps(out)
    if not allowed:
        assert resp["status"]["code"] == 500 and "internal error" in resp["status"]["message"]
    assert any(req["request"]["uid"] == getattr(r, "uid", None) for r in caplog.records)


def test_patch_is_encoded_only_in_enforce_mode():
    ops = ({"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},)
    decide = lambda _r: Decision(patch=ops)  # noqa: E731
    enforce = admission.respond(review(BAD_BINDING), policy="x", evaluate=decide, settings=PolicyConfig("enforce", "deny"))
    assert enforce["response"]["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(enforce["response"]["patch"])) == list(ops)
    warn = admission.respond(review(BAD_BINDING), policy="x", evaluate=decide, settings=PolicyConfig("warn", "deny"))
    assert "patch" not in warn["response"] and "patchType" not in warn["response"]


def test_finding_code_and_reason_reach_the_status():
    f = Finding(policy="x", kind="Pod", name="p", message="wait", summary="wait", code=429, reason="TooManyRequests")
    out = admission.respond(
        review(BAD_BINDING), policy="x", evaluate=lambda _r: Decision(findings=(f,)), settings=PolicyConfig("enforce", "deny")
    )
    assert out["response"]["status"] == {
        "code": 429,
        "reason": "TooManyRequests",
        "status": "Failure",
        "message": "wait Why: https://kubernetes.io/docs/concepts/cluster-administration/dra/",
    }


# ------------------------------------------------------------------ /mutate/daemonsets through the app
def _ds_review():
    from tests.builders import driver_daemonset

    body = review(binding("x", "y", []))  # reuse the envelope, replace the object
    req = body["request"]
    req["kind"] = {"group": "apps", "version": "v1", "kind": "DaemonSet"}
    req["resource"] = {"group": "apps", "version": "v1", "resource": "daemonsets"}
    req["object"] = driver_daemonset()
    return body


@pytest.mark.parametrize("mode", ["enforce", "warn", "audit"])
def test_probe_modes(mode):
    resp = post(make_client(mode), _ds_review(), path="/mutate/daemonsets").get_json()["response"]
    assert resp["allowed"] is True
    if mode == "enforce":
        ops = json.loads(base64.b64decode(resp["patch"]))
        assert any(op["path"].endswith("/livenessProbe") for op in ops)
        assert "probes-patched" in resp["auditAnnotations"]
        # kubectl tells whoever applied it that dra-guard changed the object
        assert resp["warnings"] == [
            "dra-guard changed this DaemonSet (probes): add a gRPC livenessProbe (port 51515) to driver container plugin"
        ]
    elif mode == "warn":
        assert "patch" not in resp
        assert any(w.startswith("dra-guard would add") for w in resp["warnings"])
    else:
        assert "patch" not in resp and "warnings" not in resp
        assert "livenessProbe" in resp["auditAnnotations"]["probes-finding"]


def test_probe_policy_error_fails_open_by_default(monkeypatch):
    from webhook.policies import probes

    monkeypatch.setattr(probes, "evaluate", lambda *a, **k: 1 / 0)
    resp = post(make_client(), _ds_review(), path="/mutate/daemonsets").get_json()["response"]
    assert resp["allowed"] is True and "internal error" in resp["warnings"][0]


@pytest.mark.parametrize("user_info", ["x", [1], True, 3, None])
def test_odd_user_info_with_a_finding_still_answers(user_info):
    body = review(BAD_BINDING)
    body["request"]["userInfo"] = user_info
    rv = post(make_client(), body)
    assert rv.status_code == 200 and rv.get_json()["response"]["allowed"] is False


def test_operation_metric_label_is_bounded():
    client = make_client()
    for op in ("X" * 1000, "PATCH", "create"):
        body = review(BAD_BINDING)
        body["request"]["operation"] = op
        assert post(client, body).status_code == 200
    text = client.get("/metrics").get_data(as_text=True)
    assert "X" * 100 not in text and 'operation="other"' in text


def test_noop_endpoint_allows_what_the_rbac_guard_refuses_and_counts_nothing():
    """/validate/noop is the benchmark floor: same envelope checks, no policy, no metrics."""
    from prometheus_client import REGISTRY

    labels = {"policy": "rbac", "operation": "CREATE", "decision": "deny", "mode": "enforce"}
    client = make_client("enforce")
    before = REGISTRY.get_sample_value("dra_guard_admission_requests_total", labels) or 0
    body = review(BAD_BINDING)
    rv = post(client, body, path="/validate/noop")
    assert rv.status_code == 200
    assert rv.get_json() == {
        "apiVersion": body["apiVersion"],
        "kind": "AdmissionReview",
        "response": {"uid": body["request"]["uid"], "allowed": True},
    }
    assert (REGISTRY.get_sample_value("dra_guard_admission_requests_total", labels) or 0) == before
    assert post(client, body, path="/validate/rbac").get_json()["response"]["allowed"] is False
    assert REGISTRY.get_sample_value("dra_guard_admission_requests_total", labels) == before + 1


@pytest.mark.parametrize(
    "body, content_type, needle",
    [
        (b"{not json", "application/json", "not valid JSON"),
        ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}, "application/json", "request"),
        ({}, "text/plain", "Content-Type"),
    ],
)
def test_noop_endpoint_checks_the_envelope_like_the_policies(body, content_type, needle):
    rv = post(make_client(), body, path="/validate/noop", content_type=content_type)
    assert rv.status_code == 400
    assert needle in rv.get_json()["error"]
