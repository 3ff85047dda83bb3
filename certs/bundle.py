"""The certificate Secret of `certificates.mode: self`, parsed (Bundle) and written back (Bundle.data).

One Secret in dra-guard's namespace holds it all: keys ca.crt, ca.key (the current CA pair),
ca-bundle.crt (the CAs the apiserver must trust, current first), tls.crt and tls.key (the serving
pair). Every replica serves a certificate from the same CA.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

import certs


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the certificate's DER, hex."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def pem_certs(data: bytes) -> list[x509.Certificate]:
    """The certificates of PEM `data` (a bundle); [] when empty or unreadable."""
    try:
        return x509.load_pem_x509_certificates(data) if data else []
    except ValueError:
        return []


@dataclasses.dataclass
class Bundle:
    """The parsed Secret: current CA pair, trusted CAs (current first) and the serving pair."""

    ca: certs.KeyPair
    trusted: list[x509.Certificate]
    serving: certs.KeyPair | None
    resource_version: str = ""

    def data(self) -> dict[str, bytes]:
        """The Secret's data for this bundle."""
        out = {"ca.crt": self.ca.cert_pem(), "ca.key": self.ca.key_pem(), "ca-bundle.crt": self.trust_pem()}
        if self.serving is not None:
            out["tls.crt"] = self.serving.cert_pem()
            out["tls.key"] = self.serving.key_pem()
        return out

    def trust_pem(self) -> bytes:
        """The PEM caBundle: every trusted CA, current first."""
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.trusted)

    @classmethod
    def from_secret(cls, secret: Mapping[str, Any]) -> Bundle | None:
        """Parse a Secret dict; None when the CA pair is missing or unreadable."""
        data = secret.get("data") or {}
        try:
            ca_cert = x509.load_pem_x509_certificate(data.get("ca.crt", b""))
            ca_key = serialization.load_pem_private_key(data.get("ca.key", b""), password=None)
        except (ValueError, TypeError):
            return None
        ca = certs.KeyPair(cert=ca_cert, key=ca_key)  # type: ignore[arg-type]
        trusted = pem_certs(data.get("ca-bundle.crt", b"")) or [ca_cert]
        if fingerprint(trusted[0]) != fingerprint(ca_cert):
            trusted = [ca_cert] + [c for c in trusted if fingerprint(c) != fingerprint(ca_cert)]
        serving = None
        try:
            key = serialization.load_pem_private_key(data.get("tls.key", b""), password=None)
            serving = certs.KeyPair(cert=x509.load_pem_x509_certificate(data.get("tls.crt", b"")), key=key)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            serving = None
        return cls(ca=ca, trusted=trusted, serving=serving, resource_version=str(secret.get("resourceVersion", "")))
