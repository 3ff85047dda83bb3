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
