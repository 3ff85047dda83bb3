"""The real `dra-guard serve`: gunicorn's threaded worker over TLS, verified against the CA."""
from __future__ import annotations

import socket
import ssl

import pytest
import requests

from tests.builders import binding, review, subject
from tests.serve import DraGuardProcess

pytestmark = pytest.mark.http


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = DraGuardProcess(tmp_path_factory.mktemp("serve"), "--no-cluster")
    try:
        proc.wait("/readyz")
        yield proc
    finally:
        proc.stop()


def test_health_and_readiness(server):
    s = server.session()
    assert s.get(server.url + "/healthz").json() == {"status": "ok"}
    assert s.get(server.url + "/readyz").json()["ready"] is True


def test_review_over_tls_refuses_unknown_role_binding_with_warning(server):
    # --no-cluster: the role is unknown, so the binding is allowed with a warning naming it
    body = review(binding("b", "missing-role", [subject("Group", "team-a")]))
    out = server.session().post(server.url + "/validate/rbac", json=body).json()
    assert out["response"]["uid"] == body["request"]["uid"]
    assert out["response"]["allowed"] is True and "missing-role" in out["response"]["warnings"][0]


def test_malformed_body_gets_400_json_through_gunicorn(server):
    rv = server.session().post(server.url + "/validate/rbac", data=b"{", headers={"Content-Type": "application/json"})
    assert rv.status_code == 400 and "error" in rv.json()


def test_self_signed_ca_is_reused_on_restart(server, tmp_path):
    first = server.ca_file.read_bytes()
    again = DraGuardProcess(server.workdir, "--no-cluster")
    try:
        again.wait()
        assert again.ca_file.read_bytes() == first
    finally:
        again.stop()


def test_client_not_trusting_the_ca_is_refused(server):
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server.url + "/healthz", timeout=5)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
def test_old_tls_versions_are_refused(server, version):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(server.ca_file)
    try:
        ctx.minimum_version = version
        ctx.maximum_version = version
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    except (ValueError, ssl.SSLError):
        pytest.skip(f"this OpenSSL cannot even offer {version.name}")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        with pytest.raises(ssl.SSLError):
            with ctx.wrap_socket(sock, server_hostname="localhost"):
                pass


def test_start_without_tls_is_a_clear_usage_error(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "webhook.cli", "serve", "--no-cluster"], capture_output=True, text=True)
    assert out.returncode == 2 and "--tls-cert-file" in out.stderr


def test_bad_config_stops_startup_naming_the_key(tmp_path):
    proc = DraGuardProcess(tmp_path, "--no-cluster", config="policies:\n  rbac:\n    mode: sometimes\n")
    assert proc.proc.wait(30) == 2
    proc.stop()
    assert "policies.rbac.mode" in proc.log()


def _raw(server, payload: bytes, *, read=True) -> bytes:
    ctx = ssl.create_default_context(cafile=str(server.ca_file))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        with ctx.wrap_socket(sock, server_hostname="localhost") as tls:
            tls.sendall(payload)
            data = b""
            while read and b"\r\n\r\n" not in data:
                data += tls.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += tls.recv(65536)
            return head + b"\r\n\r\n" + body


def test_malformed_chunked_body_gets_400_json(server):
    answer = _raw(server, b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert answer.startswith(b"HTTP/1.1 400") and b'"error"' in answer


def test_chunked_body_over_the_limit_is_refused_not_cut(server):
    import json as _json
    body = _json.dumps(review(binding("b", "r", [subject("Group", "g")]))).encode()
    body += b" " * (8 * 1024 * 1024 - len(body)) + b"GARBAGE"
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 65536]), body[i:i + 65536]) for i in range(0, len(body), 65536))
    s = server.session()
    rv = s.post(server.url + "/validate/rbac", data=iter([chunks[:0]] + [body[i:i + 65536] for i in range(0, len(body), 65536)]),
                headers={"Content-Type": "application/json"})
    assert rv.status_code == 400 and "maxRequestBytes" in rv.json()["error"]


def test_stalled_clients_do_not_starve_the_server(server):
    """More stalled TLS handshakes than worker threads: other clients are still answered in time."""
    import time as _time
    stalled = []
    try:
        for _ in range(12):  # server.threads is 8
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
            stalled.append(sock)
        _time.sleep(0.5)
        started = _time.monotonic()
        ok = 0
        while _time.monotonic() - started < 12:
            try:
                if server.session().get(server.url + "/healthz", timeout=3).status_code == 200:
                    ok += 1
                    break
            except requests.RequestException:
                pass
        assert ok, "no answer while 12 clients stalled their handshakes"
        assert _time.monotonic() - started < 8  # the 5 s socket timeout frees the threads
    finally:
        for sock in stalled:
            sock.close()


def test_trickling_clients_do_not_hold_threads(server):
    """Clients sending their request one byte at a time: cut off, and others are answered."""
    import threading
    import time as _time
    stop = threading.Event()
    cut = []

    def trickle():
        ctx = ssl.create_default_context(cafile=str(server.ca_file))
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                with ctx.wrap_socket(sock, server_hostname="localhost") as tls:
                    for byte in b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b" " * 100:
                        if stop.is_set():
                            return
                        tls.sendall(bytes([byte]))
                        _time.sleep(1.0)
        except OSError:
            cut.append(1)

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(12)]
    for t in threads:
        t.start()
    try:
        _time.sleep(8)  # longer than the request read limit
        started = _time.monotonic()
        assert server.session().get(server.url + "/healthz", timeout=3).status_code == 200
        assert _time.monotonic() - started < 3
        assert len(cut) >= 8, len(cut)  # every trickler that held a worker thread was cut off
        log = server.log_file.read_text(errors="replace")
        assert '"client timed out' in log  # one warning line per cut-off client ...
        assert "Socket error processing request" not in log  # ... not gunicorn's traceback at ERROR
    finally:
        stop.set()


def test_idle_keepalive_connections_and_clients_that_never_read(server):
    """200 idle TLS keep-alive connections, and 12 clients whose 2 MB answers are never read:
    other clients are still answered within the webhook timeout."""
    import json as _json
    import time as _time
    ctx = ssl.create_default_context(cafile=str(server.ca_file))
    idle, stuck = [], []
    try:
        for _ in range(200):  # like the apiserver's pool: one request each, then idle, kept alive
            sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="localhost")
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            idle.append(sock)
        body = review(binding("b", "r", [subject("Group", "g")]))
        body["request"]["uid"] = "u" * 2_000_000  # echoed back: a large answer
        raw = _json.dumps(body).encode()
        for _ in range(12):
            sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="localhost")
            sock.sendall(b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
            stuck.append(sock)  # and never read
        _time.sleep(0.5)
        started = _time.monotonic()
        assert server.session().get(server.url + "/healthz", timeout=3).status_code == 200
        assert _time.monotonic() - started < 3
    finally:
        for sock in idle + stuck:
            sock.close()


@pytest.mark.parametrize("ciphers", ["DES-CBC3-SHA", "RC4-SHA", "NULL-SHA256", "EXP-RC4-MD5"])
def test_weak_ciphers_are_refused(server, ciphers):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(server.ca_file)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # TLS 1.3 suites are all strong and not configurable
    try:
        ctx.set_ciphers(f"{ciphers}:@SECLEVEL=0")
    except ssl.SSLError:
        pytest.skip(f"this OpenSSL cannot even offer {ciphers}")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        with pytest.raises(ssl.SSLError):
            with ctx.wrap_socket(sock, server_hostname="localhost"):
                pass


@pytest.mark.parametrize("raw, status", [
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),  # request line over 8190 bytes
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(120)) + b"\r\n", 431),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400),
])
def test_requests_gunicorn_refuses_itself_get_json_not_html(server, raw, status):
    """Protocol errors gunicorn answers before the app sees the request: JSON like every other error."""
    import json as _json
    ctx = ssl.create_default_context(cafile=str(server.ca_file))
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="localhost") as tls:
        tls.sendall(raw)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 %d " % status), head
    assert b"content-type: application/json" in head.lower() and b"<html" not in body
    assert _json.loads(body)["error"]
