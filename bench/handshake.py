"""Server CPU of one TLS handshake, by key type and TLS 1.3 session tickets (Python's ssl, OpenSSL).

    python -m bench.handshake [--count 300]

Client and server in this process over memory BIOs (no sockets, no event loop): the server's
thread CPU time in do_handshake per handshake, for an ECDSA P-256 key (what `dra-guard serve
--self-signed`, the self-managed certificates and the chart's cert-manager Certificate make) and an
RSA-2048 key, each with OpenSSL's default 2 session tickets per TLS 1.3 handshake and with none
(certs.reload.server_context: the kube-apiserver's Go client keeps no session cache, so it never
resumes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import ssl
import sys
import tempfile
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


def write_pair(folder: pathlib.Path, kind: str) -> tuple[pathlib.Path, pathlib.Path]:
    """A self-signed certificate for localhost with a `kind` key ("ecdsa-p256" or "rsa-2048")."""
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey = (
        ec.generate_private_key(ec.SECP256R1()) if kind == "ecdsa-p256" else rsa.generate_private_key(65537, 2048)
    )
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    crt, pem = folder / f"{kind}.crt", folder / f"{kind}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return crt, pem


def server_cpu_per_handshake(crt: pathlib.Path, key: pathlib.Path, tickets: int, count: int) -> float:
    """Microseconds of the server's CPU per TLS handshake (TLS 1.3, Python's default groups)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(crt, key)
    server.num_tickets = tickets
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(crt)
    spent = 0.0
    for _ in range(count):
        to_server, from_server, to_client, from_client = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
        s = server.wrap_bio(to_server, from_server, server_side=True)
        c = client.wrap_bio(to_client, from_client, server_hostname="localhost")
        client_done = server_done = False
        while not (client_done and server_done):
            if not client_done:
                try:
                    c.do_handshake()
                    client_done = True
                except ssl.SSLWantReadError:
                    pass
            to_server.write(from_client.read())
            started = time.thread_time()
            if not server_done:
                try:
                    s.do_handshake()
                    server_done = True
                except ssl.SSLWantReadError:
                    pass
            spent += time.thread_time() - started
            to_client.write(from_server.read())
    return spent / count * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300, help="handshakes per case")
    args = parser.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("ecdsa-p256", "rsa-2048"):
            crt, key = write_pair(pathlib.Path(tmp), kind)
            for tickets in (2, 0):
                out[f"{kind}, {tickets} tickets"] = round(server_cpu_per_handshake(crt, key, tickets, args.count))
    print(json.dumps({"server_cpu_us_per_handshake": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
