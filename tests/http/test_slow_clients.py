"""Slow, silent and trickling clients hold none of the worker's threads: connections that send
nothing, half a ClientHello, a request or a body a byte at a time (on the webhook port or the
probe port), or nothing after their TLS handshake. An honest client (the apiserver's way: reuse a
kept-alive connection, else dial) is answered within the webhook timeout meanwhile; for the
eviction webhook (failurePolicy Ignore) a review left unanswered is an eviction let through
unjudged. Each test's docstring names its row of docs/reliability.md (A1, A1b, A1c, A4, B2, B3,
B3b, F1). A duration is compared only with the bound its failure would pass (the webhook's
timeout, or CLIENT_SOCKET_TIMEOUT: what a thread held by a slow client would cost the next
review), never with a guess of this machine's speed."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time

import pytest
import requests

from tests.builders import binding, review, subject
from tests.http.clients import (
    THREADS,
    WEBHOOK_TIMEOUT,
    HonestClient,
    client_auth_server,
    connect,
    get_healthz,
    healthz_wait,
    honest_under_tricklers,
    judged_within,
    read_response,
    review_bytes,
    tls_context,
    trickle,
)
from webhook.serve.front.connection import CLIENT_SOCKET_TIMEOUT

pytestmark = pytest.mark.http


def test_reconnecting_slow_clients_do_not_starve_eviction_reviews(server):
    """Slowloris that reconnects: 16 TLS connections, each sending a request one byte every 1.5 s
    and dialing again when cut off after the 5 s request read limit. Were a request read in a
    thread, they would hold the worker's 8 threads nearly all the time, and an honest client sending
    an eviction review every 0.3 s over 10 s would get reviews unanswered within the 3 s webhook
    timeout (with failurePolicy Ignore, each an eviction allowed unjudged): every one is answered."""
    honest_under_tricklers(HonestClient(server), tls_context(server), server.port, b"POST /validate/evictions HTTP/1.1\r\n")


def test_slow_clients_on_the_probe_port_do_not_starve_reviews_from_the_apiserver(tmp_path):
    """Finding A1b: with server.clientCAFile set (only the apiserver's certificate is heard on the
    admission port: the threat model's answer to "anyone on the network"), server.probePort asks no
    client certificate and is served by the same worker threads and connection slots. The A1
    slowloris (16 reconnecting connections trickling a request one byte per 1.5 s) sent to the
    probe port, by a client without any certificate, starves reviews sent by the apiserver (with
    its client certificate) on the admission port."""
    proc, probe_port, good = client_auth_server(tmp_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.proc.poll() is None, proc.log()
            try:
                probe_ctx = ssl.create_default_context(cafile=str(proc.ca_file))
                with probe_ctx.wrap_socket(
                    socket.create_connection(("127.0.0.1", probe_port), timeout=2), server_hostname="localhost"
                ) as tls:
                    tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                    if read_response(tls)[0].startswith(b"HTTP/1.1 200"):
                        break
            except (OSError, AssertionError):
                pass
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.1)
        honest = HonestClient(proc)
        honest.ctx = ssl.create_default_context(cafile=str(proc.ca_file))
        honest.ctx.load_cert_chain(*good)
        honest.review("before")
        assert not honest.failures, honest.failures
        honest_under_tricklers(honest, probe_ctx, probe_port, b"GET /healthz HTTP/1.1\r\n")
    finally:
        proc.stop()


def test_slow_request_bodies_do_not_hold_the_lane_of_rbac_and_daemonset_reviews(server):
    """Finding A4: a review takes its lane's slot before its body is read (PolicyRoute: lane.enter,
    then Reader.review), and a review that finds its lane full gets the overload answer after 0.1 s.
    Six connections that send the headers of a POST /validate/rbac and then its body one byte per
    1.5 s (dialing again when cut off after 5 s) hold the six slots that RBAC and DaemonSet reviews
    share. Honest reviews sent meanwhile on a kept-alive connection (every 0.3 s for 8 s) got the
    overload answer about half the time: a driver DaemonSet admitted without its gRPC liveness
    probe (probes failureMode allow: allowed, no patch) and RBAC writes refused with 503. Only
    6 slow connections, no CPU: not the overload that lanes are for."""
    from collections import Counter

    from tests.builders import binding, driver_daemonset, plugin_container, review

    ctx = tls_context(server)
    stop = threading.Event()

    head = b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"

    ds = review(binding("x", "y", []))
    ds["request"].update(
        kind={"group": "apps", "version": "v1", "kind": "DaemonSet"},
        resource={"group": "apps", "version": "v1", "resource": "daemonsets"},
        object=driver_daemonset(containers=[plugin_container("a", args=["--healthcheck-port=1"])]),
    )
    rbac = review(binding("b", "everything", []))
    honest = ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=5), server_hostname="localhost")

    def post(path: bytes, body: dict) -> dict:
        data = json.dumps(body).encode()
        honest.sendall(
            b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(data) + data
        )
        return json.loads(read_response(honest)[1])["response"]

    assert "patch" in post(b"/mutate/daemonsets", ds)
    attackers = [threading.Thread(target=trickle, args=(ctx, server.port, head, stop), daemon=True) for _ in range(6)]
    for t in attackers:
        t.start()
    outcomes: Counter = Counter()
    try:
        time.sleep(1.5)
        end = time.monotonic() + 8
        while time.monotonic() < end:
            outcomes["daemonset patched" if "patch" in post(b"/mutate/daemonsets", ds) else "daemonset NOT patched"] += 1
            outcomes["rbac judged" if post(b"/validate/rbac", rbac)["allowed"] else "rbac refused"] += 1
            time.sleep(0.3)
    finally:
        stop.set()
        honest.close()
        for t in attackers:
            t.join(3)
    assert outcomes["daemonset NOT patched"] == 0 and outcomes["rbac refused"] == 0, dict(outcomes)


def test_expect_100_continue_does_not_restart_the_request_read_limit(server):
    """REQUEST_READ_LIMIT (5 s from a request's first byte) holds for a request with "Expect:
    100-continue" too: an interim answer must not restart its clock. A client that trickles the
    headers for ~4.5 s and the body for ~4.5 s more would otherwise hold its connection (and, once
    the body is read, an eviction lane slot) for ~9 s and be answered, doubling what each trickling
    connection holds; it is cut off at 5 s, as without the Expect header."""
    head, body = review_bytes("x").split(b"\r\n\r\n", 1)
    head += b"\r\nExpect: 100-continue\r\n\r\n"
    with tls_context(server).wrap_socket(
        socket.create_connection(("127.0.0.1", server.port), timeout=20), server_hostname="localhost"
    ) as tls:
        started = time.monotonic()
        try:
            for part in (head[:20], head[20:40], head[40:]):
                tls.sendall(part)
                time.sleep(1.5)
            step = len(body) // 4 + 1
            for i in range(4):
                time.sleep(1.5 if i else 0)
                tls.sendall(body[i * step : (i + 1) * step])
            tls.settimeout(5)
            data = b""
            while b"AdmissionReview" not in data:
                chunk = tls.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            data = b"<cut off>"
        took = time.monotonic() - started
    assert b"AdmissionReview" not in data, f"a request trickled over {took:.1f} s was read in full and answered"


def test_fast_trickling_clients_do_not_hold_the_pool_threads(server):
    """The slowloris above, faster: 16 TLS connections that each send their request one byte every
    5 ms (200 bytes/s each, TCP_NODELAY) and dial again when cut off after 5 s. A reader that waits
    in a thread for bytes that come that often would hold the worker's 8 threads nearly all the
    time; an honest client sending an eviction review every 0.3 s over 8 s gets every review
    answered within the 3 s webhook timeout (failurePolicy Ignore would allow the others)."""
    honest_under_tricklers(
        HonestClient(server), tls_context(server), server.port, b"POST /validate/evictions HTTP/1.1\r\n", every=0.005
    )


def test_a_head_over_64_kib_is_not_read_by_the_parser_in_a_pool_thread(server):
    """A head over MAX_HEAD_BYTES (64 KiB) without its blank line is refused by the front's parser
    from the bytes it has, never read on with a thread waiting. 16 TLS connections that each send a
    request line and 9 valid header lines of 7,900 bytes (~71 KB, no blank line) at once, then one
    more byte every 1.5 s, and dial again when cut off: an honest client sending an eviction review
    every 0.3 s still gets every review answered within the 3 s webhook timeout."""
    head = (
        b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 7900) for i in range(9))
        + b"X-Last: "
    )
    honest_under_tricklers(HonestClient(server), tls_context(server), server.port, head)


def test_a_trailer_section_over_64_kib_is_not_read_by_the_parser_in_a_pool_thread(server):
    """A chunked body's trailer section is never read: a chunked request is answered 411 from its
    head. 16 connections sending a chunked eviction review "0" + one trailer line of 66,000 bytes
    (no CRLF), then a byte every 1.5 s, leave an honest client's reviews answered in time."""
    head = (
        b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\nX-Pad: "
    ) + b"a" * 66000
    honest_under_tricklers(HonestClient(server), tls_context(server), server.port, head)


def test_partial_client_hellos_hold_no_thread(server):
    """24 connections that send the first 3 bytes of a TLS record and stop (3 rounds of the 8
    threads' 2 s handshake bound before): an eviction review on a connection kept alive from before
    and one on a new connection are judged at once. Before: both closed unanswered."""
    kept = connect(server)
    judged_within(kept, "before")
    stalled = []
    try:
        for _ in range(24):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"\x16\x03\x01")
            stalled.append(s)
        time.sleep(0.3)
        # a review that waited for a thread held by a stalled handshake would take its bound
        assert judged_within(kept, "kept-alive") < CLIENT_SOCKET_TIMEOUT
        with connect(server) as new:
            assert judged_within(new, "new") < CLIENT_SOCKET_TIMEOUT
    finally:
        for s in stalled:
            s.close()
        kept.close()


def test_a_client_that_never_closes_does_not_stall_the_other_connections(server):
    """Clients that stall half-way through a request and never send a FIN: while the server cuts
    them off and closes their connections, a kept-alive connection is served at once (a close never
    waits for a client's FIN in a way that holds the other connections)."""
    ctx = tls_context(server)
    kept = ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=20), server_hostname="localhost")
    stalled = []
    try:
        assert get_healthz(kept).startswith(b"HTTP/1.1 200")
        for _ in range(4):
            tls = ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=20), server_hostname="localhost")
            tls.sendall(b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\n")  # and never the rest, nor a FIN
            stalled.append(tls)
        time.sleep(5.6)  # the server cuts them off (408) 5 s after their first byte and closes them
        started = time.monotonic()
        assert get_healthz(kept).startswith(b"HTTP/1.1 200")
        waited = time.monotonic() - started
        assert waited < CLIENT_SOCKET_TIMEOUT, f"a kept-alive connection waited {waited:.2f} s behind closing ones"
    finally:
        for sock in [kept, *stalled]:
            sock.close()


def test_silent_connections_do_not_hold_the_worker_threads(server):
    """Connections that send nothing (not even a ClientHello), twice as many as the threads, wait on
    the event loop: none holds a thread, and /healthz is answered at once."""
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(2 * THREADS)]
    try:
        waited = healthz_wait(server)
        assert waited < CLIENT_SOCKET_TIMEOUT, f"/healthz waited {waited:.2f} s behind {len(silent)} silent connections"
    finally:
        for sock in silent:
            sock.close()


def test_connections_idle_after_their_tls_handshake_do_not_hold_the_worker_threads(server):
    """The kube-apiserver's webhook client (Go's http.Transport) dials a new connection for every
    review of a burst that finds no idle one; a review whose connection is slow to come takes one
    freed meanwhile, and the new connection, its TLS handshake done, waits idle in the client's
    pool for a later review. Had such connections held a thread each until a timeout, 8 at a time
    would hold every thread in a burst and the reviews behind them get the 3 s webhook timeout. A
    connection without a request after its handshake waits on the event loop, kept alive for a
    later request."""
    ctx = tls_context(server)
    idle = [
        ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="localhost")
        for _ in range(2 * THREADS)
    ]  # each returns once the handshake is done, and sends nothing
    try:
        waited = healthz_wait(server)
        assert waited < CLIENT_SOCKET_TIMEOUT, (
            f"/healthz waited {waited:.2f} s behind {len(idle)} connections idle after their handshake"
        )
        time.sleep(2.5)  # past the 2 s socket timeout: still kept alive, like a connection after an answer
        assert get_healthz(idle[0]).startswith(b"HTTP/1.1 200")
    finally:
        for sock in idle:
            sock.close()


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
        assert _time.monotonic() - started < 8  # the stalled handshakes hold no thread
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
        assert server.session().get(server.url + "/healthz", timeout=WEBHOOK_TIMEOUT).status_code == 200
        assert _time.monotonic() - started < WEBHOOK_TIMEOUT
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
            sock.sendall(
                b"POST /validate/rbac HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(raw) + raw
            )
            stuck.append(sock)  # and never read
        _time.sleep(0.5)
        started = _time.monotonic()
        assert server.session().get(server.url + "/healthz", timeout=WEBHOOK_TIMEOUT).status_code == 200
        assert _time.monotonic() - started < WEBHOOK_TIMEOUT
    finally:
        for sock in idle + stuck:
            sock.close()


def test_a_reviews_deadline_counts_from_its_first_byte_however_slowly_the_rest_comes(tmp_path):
    """A review's deadline (server.reviewDeadlineSeconds) runs from its first byte: one whose bytes
    took longer than that to arrive gets the overload answer unjudged (eviction: 429, retry), and the
    same review sent at once is judged. The front hands the arrival to the app in the WSGI environ
    (webhook.serve.front.wsgi.ARRIVAL); without it the app would count from when it was called."""
    from tests.serve import DraGuardProcess

    proc = DraGuardProcess(tmp_path, "--no-cluster", config="server:\n  reviewDeadlineSeconds: 1\n")
    try:
        proc.wait("/readyz")
        with connect(proc) as tls:
            judged_within(tls, "at-once")  # allowed: judged, so within its deadline
        raw = review_bytes("slow")
        head, body = raw.split(b"\r\n\r\n", 1)
        with connect(proc, timeout=10) as tls:
            for part in (head[:30], head[30:] + b"\r\n\r\n", body):
                tls.sendall(part)
                time.sleep(0.7)  # 1.4 s from the first byte to the last: within the 5 s read limit
            response = json.loads(read_response(tls)[1])["response"]
        assert response["uid"] == "slow" and response["allowed"] is False, response
        assert response["status"]["code"] == 429 and "reviewDeadlineSeconds" in response["status"]["message"], response
    finally:
        proc.stop()
