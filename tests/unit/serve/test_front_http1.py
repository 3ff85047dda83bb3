"""The front's HTTP/1.1 reading and writing (webhook.serve.front.http1) with the real httptools
parser: what is refused and with which status, requests in order, the framing of answers. The same
cases over TLS against a real `dra-guard serve`: tests/http/test_framing.py."""

from __future__ import annotations

import pytest

from webhook.serve.front.http1 import MAX_HEAD_BYTES, RequestReader, answer_bytes

OK = b"POST /validate/evictions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def read(*parts: bytes, max_body: int = 1000) -> RequestReader:
    reader = RequestReader(max_body)
    for part in parts:
        reader.feed(part)
    return reader


def test_a_request_in_pieces_is_whole_once_its_body_is():
    reader = read(OK[:10], OK[10:60], OK[60:-1])
    assert not reader.requests and reader.in_message and reader.error is None
    reader.feed(OK[-1:])
    (request,) = reader.requests
    assert (request.method, request.target, request.http_version, request.body) == (
        b"POST",
        b"/validate/evictions",
        b"1.1",
        b"{}",
    )
    assert (b"content-type", b"application/json") in request.headers and request.keep_alive
    assert not reader.in_message


def test_pipelined_requests_are_kept_in_order_and_a_refusal_after_them():
    """Two whole requests and a malformed third in one read: both requests are answered first,
    then the refusal (h11 read one request at a time; llhttp reads all it is given)."""
    reader = read(OK + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET / HTTP/1.1\r\nX : y\r\n\r\n")
    assert [r.target for r in reader.requests] == [b"/validate/evictions", b"/healthz"]
    assert reader.error is not None and reader.error.status == 400


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n", 414),  # refused before the request line ends
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)), 431),  # before the head ends
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n", 413),  # over max_body, before the body
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),  # h11's status
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", 400),
        # accepted by h11, refused by llhttp (smuggling vectors; Go's net/http never sends them)
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", 400),  # obsolete line folding
        (b"GET / HTTP/1.1\nHost: x\n\n", 400),  # bare LF
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400),  # duplicate
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n{}", 400),
        # refused by both
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -2\r\n\r\n{}", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}", 400),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n{}", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX : y\r\n\r\n", 400),  # whitespace before the colon
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400),  # NUL in a value
        (b"GET / HTTP/1.1\r\n Host: x\r\n\r\n", 400),  # whitespace before the first field
        (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host (h11's check)
        (b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),  # two Hosts (h11's check)
        (b"GET /\r\n\r\n", 400),  # HTTP/0.9
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n", 501),  # unknown method (h11 gave it to the app)
        (b"POST / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\n{}", 400),
    ],
)
def test_refused_requests(raw, status):
    reader = read(raw)
    assert not reader.requests and reader.error is not None, reader.requests
    assert reader.error.status == status, (reader.error.status, reader.error.detail)
    assert reader.error.detail


def test_a_head_over_the_limit_is_refused_before_it_is_complete():
    """Counted over reads while the head is incomplete: a trickled head is refused once over
    MAX_HEAD_BYTES, not when (if ever) its blank line comes."""
    reader = read(b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ")
    for _ in range(MAX_HEAD_BYTES // 4096 - 1):  # 30 bytes + 15 * 4096: under
        reader.feed(b"a" * 4096)
    assert reader.error is None
    reader.feed(b"a" * 4096)
    assert reader.error is not None and reader.error.status == 431


def test_a_head_under_the_limit_in_many_reads_is_read():
    reader = read(*(bytes([b]) for b in OK))
    assert len(reader.requests) == 1 and reader.error is None


def test_nothing_after_a_refusal_is_read():
    reader = read(b"GET / HTTP/1.1\r\nX : y\r\n\r\n")
    reader.feed(OK)
    assert not reader.requests and reader.error is not None and reader.error.status == 400


@pytest.mark.parametrize(
    "raw, keep_alive",
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", False),  # h11 closed HTTP/1.0 too
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n", False),
    ],
)
def test_which_requests_keep_the_connection(raw, keep_alive):
    (request,) = read(raw).requests
    assert request.keep_alive is keep_alive


def test_an_upgrade_request_is_answered_and_nothing_after_it_read():
    reader = read(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n" + OK)
    assert [r.target for r in reader.requests] == [b"/healthz"] and reader.ended and reader.error is None


def test_expect_100_continue_waits_for_the_body_as_h11_did():
    """No interim 100 is sent (h11 did not either): the client sends its body after its own wait."""
    reader = read(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert not reader.requests and reader.in_message and reader.error is None
    reader.feed(b"{}")
    assert reader.requests[0].body == b"{}"


def test_an_answer_is_framed_by_its_body():
    data = answer_bytes(
        200,
        b"OK",
        [(b"Content-Type", b"application/json"), (b"Content-Length", b"99"), (b"Connection", b"close")],
        b"{}",
        head=False,
    )
    assert data == b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"


def test_an_answer_to_head_has_the_apps_length_and_no_body():
    data = answer_bytes(200, b"OK", [(b"Content-Length", b"17"), (b"Transfer-Encoding", b"chunked")], b"", head=True)
    assert data == b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n"


def test_an_answer_without_a_body_by_its_status_has_no_length():
    assert answer_bytes(204, b"No Content", [(b"Content-Length", b"0")], b"x", head=False) == b"HTTP/1.1 204 No Content\r\n\r\n"
