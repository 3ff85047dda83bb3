"""The real `dra-guard serve` over TLS, verified against its CA: health and readiness, a review,
old protocol versions and weak ciphers refused, start-up errors. With server.clientCAFile only
the apiserver is heard: the admission port requires a client certificate signed by those CAs (a
forged review without one is refused at the TLS layer: no HTTP answer at all), and
server.probePort serves the kubelet's probes and Prometheus without one, and no admission review."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time

import pytest
import requests

import certs
from tests.builders import binding, review, subject
from tests.http.clients import (
    client_certificate,
    write_pair,
)
from tests.serve import DraGuardProcess, free_port

pytestmark = pytest.mark.http


def test_health_and_readiness(shared_server):
    s = shared_server.session()
    assert s.get(shared_server.url + "/healthz").json() == {"status": "ok"}
    assert s.get(shared_server.url + "/readyz").json()["ready"] is True


def test_review_over_tls_refuses_unknown_role_binding_with_warning(shared_server):
    # --no-cluster: the role is unknown, so the binding is allowed with a warning naming it
    body = review(binding("b", "missing-role", [subject("Group", "team-a")]))
    out = shared_server.session().post(shared_server.url + "/validate/rbac", json=body).json()
    assert out["response"]["uid"] == body["request"]["uid"]
    assert out["response"]["allowed"] is True and "missing-role" in out["response"]["warnings"][0]


def test_self_signed_ca_is_reused_on_restart(shared_server, tmp_path):
    first = shared_server.ca_file.read_bytes()
    again = DraGuardProcess(shared_server.workdir, "--no-cluster")
    try:
        again.wait()
        assert again.ca_file.read_bytes() == first
    finally:
        again.stop()


def test_the_server_sends_no_tls_session_tickets(shared_server):
    """The kube-apiserver's Go client keeps no TLS session cache: tickets would be made for nothing
    at every handshake (OpenSSL's default is 2 per TLS 1.3 handshake)."""
    from tests.http.clients import connect, get_healthz

    tls = connect(shared_server)
    try:
        assert tls.version() == "TLSv1.3"
        assert b"ok" in get_healthz(tls)  # TLS 1.3 tickets come after the handshake, before this answer
        assert tls.session is not None and not tls.session.has_ticket
    finally:
        tls.close()


def test_client_not_trusting_the_ca_is_refused(shared_server):
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(shared_server.url + "/healthz", timeout=5)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
def test_old_tls_versions_are_refused(shared_server, version):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(shared_server.ca_file)
    try:
        ctx.minimum_version = version
        ctx.maximum_version = version
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    except (ValueError, ssl.SSLError):
        pytest.skip(f"this OpenSSL cannot even offer {version.name}")
    with socket.create_connection(("127.0.0.1", shared_server.port), timeout=5) as sock:
        with pytest.raises(ssl.SSLError):
            with ctx.wrap_socket(sock, server_hostname="localhost"):
                pass


@pytest.mark.parametrize("ciphers", ["DES-CBC3-SHA", "RC4-SHA", "NULL-SHA256", "EXP-RC4-MD5"])
def test_weak_ciphers_are_refused(shared_server, ciphers):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(shared_server.ca_file)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # TLS 1.3 suites are all strong and not configurable
    try:
        ctx.set_ciphers(f"{ciphers}:@SECLEVEL=0")
    except ssl.SSLError:
        pytest.skip(f"this OpenSSL cannot even offer {ciphers}")
    with socket.create_connection(("127.0.0.1", shared_server.port), timeout=5) as sock:
        with pytest.raises(ssl.SSLError):
            with ctx.wrap_socket(sock, server_hostname="localhost"):
                pass


def test_start_without_tls_is_a_clear_usage_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "webhook.cli", "serve", "--no-cluster"], capture_output=True, text=True)
    assert out.returncode == 2 and "--tls-cert-file" in out.stderr


def test_bad_config_stops_startup_naming_the_key(tmp_path):
    proc = DraGuardProcess(tmp_path, "--no-cluster", config="policies:\n  rbac:\n    mode: sometimes\n")
    assert proc.proc.wait(30) == 2
    proc.stop()
    assert "policies.rbac.mode" in proc.log()


@pytest.fixture(scope="module")
def verifying(tmp_path_factory):
    work = tmp_path_factory.mktemp("client-auth")
    client_ca = certs.generate_ca(common_name="apiserver-client-ca")
    (work / "client-ca.crt").write_bytes(client_ca.cert_pem())
    good = write_pair(work, "apiserver", client_certificate(client_ca))
    stranger = write_pair(work, "stranger", client_certificate(certs.generate_ca(common_name="other-ca")))
    probe_port = free_port()
    proc = DraGuardProcess(
        work, "--no-cluster", config=(f"server:\n  clientCAFile: {work / 'client-ca.crt'}\n  probePort: {probe_port}\n")
    )
    probe_url = f"https://127.0.0.1:{probe_port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.proc.poll() is None, proc.log()
        try:
            if proc.ca_file.exists() and requests.get(probe_url + "/readyz", verify=str(proc.ca_file), timeout=2).ok:
                break
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.1)
    try:
        yield {"proc": proc, "good": good, "stranger": stranger, "probe_url": probe_url}
    finally:
        proc.stop()


BODY = review(binding("b", "missing-role", [subject("Group", "team-a")]))


pytestmark = pytest.mark.http


def test_a_forged_review_without_a_client_certificate_is_refused_at_the_tls_layer(verifying):
    proc = verifying["proc"]
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        proc.session().post(proc.url + "/validate/rbac", json=BODY, timeout=10)
    # and at the socket level: the handshake (TLS 1.2) or the first read (TLS 1.3) fails with an alert
    ctx = ssl.create_default_context(cafile=str(proc.ca_file))
    import socket

    with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert tls.recv(100) == b""  # (never reached with an answer: raises or EOF)
                raise ConnectionResetError("closed without an answer")


def test_a_certificate_of_another_ca_is_refused(verifying):
    proc = verifying["proc"]
    s = proc.session()
    s.cert = verifying["stranger"]
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        s.post(proc.url + "/validate/rbac", json=BODY, timeout=10)


def test_the_apiserver_with_its_client_certificate_is_answered(verifying):
    proc = verifying["proc"]
    s = proc.session()
    s.cert = verifying["good"]
    out = s.post(proc.url + "/validate/rbac", json=BODY, timeout=10).json()
    assert out["response"]["uid"] == BODY["request"]["uid"] and out["response"]["allowed"] is True


def test_the_probe_port_serves_probes_and_metrics_but_no_review(verifying):
    proc, url = verifying["proc"], verifying["probe_url"]
    s = proc.session()
    assert s.get(url + "/healthz", timeout=10).json() == {"status": "ok"}
    assert s.get(url + "/readyz", timeout=10).json()["ready"] is True
    assert "dra_guard_admission_requests_total" in s.get(url + "/metrics", timeout=10).text
    for path in ("/validate/rbac", "/validate/evictions", "/mutate/daemonsets", "/validate/noop"):
        r = s.post(url + path, json=BODY, timeout=10)
        assert r.status_code == 403 and "probePort" in r.json()["error"], path
