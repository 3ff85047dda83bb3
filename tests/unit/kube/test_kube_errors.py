"""webhook.kube.errors.cause on answers the e2e tests cannot provoke from a real apiserver: a proxy's
HTML error page, a Status body without a message, an answer that is not JSON. Each is one line (the
CLI prints it as its only line on stderr)."""

from __future__ import annotations

import json

from kubernetes.client.rest import ApiException

from webhook.kube.errors import api_failure, cause


def test_a_proxy_html_page_is_one_line():
    exc = ApiException(status=502, reason="Bad Gateway")
    exc.body = b"<html>\n<head><title>502 Bad Gateway</title></head>\n<body>nginx</body>\n</html>\n"
    text = cause(exc)
    assert text.startswith("502 Bad Gateway (<html>") and "\n" not in text


def test_a_status_without_message_is_status_and_reason():
    exc = ApiException(status=500, reason="Internal Server Error")
    exc.body = json.dumps({"kind": "Status", "code": 500})
    assert cause(exc) == "500 Internal Server Error"


def test_an_answer_that_is_not_json_says_so():
    try:
        json.loads("<html>")
    except ValueError as exc:
        error = api_failure("list pods", "https://10.0.0.1:6443", exc)
    assert str(error).startswith("cannot list pods from https://10.0.0.1:6443: the answer is not JSON")


def pdb_refusal() -> ApiException:
    """The apiserver's answer to an eviction a PodDisruptionBudget refuses (k8s.io/kubernetes
    pkg/registry/core/pod/storage/eviction.go: the budget's name only in details.causes)."""
    exc = ApiException(status=429, reason="Too Many Requests")
    exc.body = json.dumps(
        {
            "kind": "Status",
            "status": "Failure",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "reason": "TooManyRequests",
            "details": {
                "causes": [
                    {
                        "reason": "DisruptionBudget",
                        "message": "The disruption budget keep-one needs 1 healthy pods and has 1 currently",
                    }
                ]
            },
            "code": 429,
        }
    )
    return exc


def test_with_details_a_pdb_refusal_names_the_budget():
    assert cause(pdb_refusal(), details=True) == (
        "429 Too Many Requests (Cannot evict pod as it would violate the pod's disruption budget: "
        "The disruption budget keep-one needs 1 healthy pods and has 1 currently)"
    )
    assert "keep-one" not in cause(pdb_refusal())  # the one-line default is unchanged


def test_with_details_a_cause_already_in_the_message_is_not_repeated():
    exc = ApiException(status=422, reason="Unprocessable Entity")
    exc.body = json.dumps(
        {
            "kind": "Status",
            "message": 'Pod "p" is invalid: spec.x: Required value',
            "details": {"causes": [{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.x"}]},
        }
    )
    assert cause(exc, details=True) == cause(exc) == '422 Unprocessable Entity (Pod "p" is invalid: spec.x: Required value)'
