"""How the real kube-apiserver frames the AdmissionReviews it sends to a webhook: always with a
Content-Length, never `Transfer-Encoding: chunked`, whatever the size of the object.

dra-guard answers a chunked request 411 Length Required (a chunked body
cannot be checked against server.maxRequestBytes before it is read, and its framing is where
parsers have been attacked). That is only safe if no apiserver ever sends one: this test records
the raw request heads the apiserver sends to a webhook of its own (a recording TLS server,
registered with a ValidatingWebhookConfiguration) for objects from a few bytes to ~900 KiB.
"""

from __future__ import annotations

import base64
import http.server
import json
import pathlib
import ssl
import threading
import time

import pytest

import certs
from tests.serve import free_port

pytestmark = pytest.mark.e2e

NAME = "framing-recorder.dra-guard.io"
LABEL = "dra-guard-framing-probe"


class Recorder(http.server.ThreadingHTTPServer):
    """A TLS webhook that allows everything and records (headers, body length) of each POST."""

    daemon_threads = True

    def __init__(self, port: int, workdir: pathlib.Path) -> None:
        ca = certs.generate_ca(common_name="framing-recorder-ca")
        serving = certs.generate_serving(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
        certs.write_bundle(workdir, ca=ca, serving=serving)
        self.ca_file = workdir / "ca.crt"
        self.seen: list[tuple[dict[str, str], int]] = []
        super().__init__(("127.0.0.1", port), _Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(workdir / "tls.crt", workdir / "tls.key")
        self.socket = ctx.wrap_socket(self.socket, server_side=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        headers = {k.lower(): v for k, v in self.headers.items()}
        if "content-length" in headers:
            body = self.rfile.read(int(headers["content-length"]))
        else:  # chunked: read it the simple way, to be able to answer and record it
            body = b""
            while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
        self.server.seen.append((headers, len(body)))  # type: ignore[attr-defined]
        review = json.loads(body)
        answer = json.dumps(
            {
                "apiVersion": review["apiVersion"],
                "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


def configuration(url: str, ca_file: pathlib.Path) -> dict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "dra-guard-framing-recorder"},
        "webhooks": [
            {
                "name": NAME,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 10,
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_file.read_bytes()).decode()},
                "objectSelector": {"matchLabels": {LABEL: "yes"}},
                "rules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}
                ],
            }
        ],
    }


def configmap(name: str, size: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": {LABEL: "yes"}},
            "data": {"blob": "x" * size},
        }
    )


def test_the_apiserver_sends_every_admission_review_with_a_content_length(control_plane, tmp_path):
    recorder = Recorder(free_port(), tmp_path)
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{recorder.server_address[1]}/validate"
    control_plane.kubectl("admin", "apply", "-f", "-", input=json.dumps(configuration(url, recorder.ca_file)))
    try:
        deadline = time.monotonic() + 30
        while not recorder.seen:  # the configuration takes a moment to reach the apiserver
            assert time.monotonic() < deadline, "the apiserver never called the recording webhook"
            control_plane.kubectl("admin", "create", "--dry-run=server", "-f", "-", input=configmap("probe", 1))
            time.sleep(0.3)
        recorder.seen.clear()
        sizes = [1, 4 * 1024, 64 * 1024, 512 * 1024, 900 * 1024]
        for size in sizes:
            control_plane.kubectl("admin", "create", "--dry-run=server", "-f", "-", input=configmap(f"framing-{size}", size))
        control_plane.kubectl("admin", "create", "-f", "-", input=configmap("framing-update", 10))
        control_plane.kubectl(
            "admin", "apply", "--server-side", "--force-conflicts", "-f", "-", input=configmap("framing-update", 300 * 1024)
        )
        assert len(recorder.seen) == len(sizes) + 2, [len(h) for h, _ in recorder.seen]
        for headers, length in recorder.seen:
            assert "transfer-encoding" not in headers, headers
            assert int(headers["content-length"]) == length, headers
        assert max(length for _, length in recorder.seen) > 900 * 1024
    finally:
        control_plane.kubectl(
            "admin", "delete", "validatingwebhookconfiguration", "dra-guard-framing-recorder", "--ignore-not-found"
        )
        control_plane.kubectl("admin", "delete", "configmap", "-n", "default", "framing-update", "--ignore-not-found")
        recorder.shutdown()
        recorder.server_close()
