"""Certificates for dra-guard's TLS server, made with `cryptography` only.

A CA (CA:TRUE, ECDSA P-256, SHA-256, 10 years by default) signs serving certificates (SANs for
every DNS name and IP, serverAuth EKU, 1 year by default). The kube-apiserver checks only SANs
(Go ignores the CN), so a certificate without SANs is never produced.

Files written by write_bundle / ensure_self_signed: ``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``
(PEM; keys 0600, certificates 0644), the names cert-manager and kubernetes.io/tls Secrets use.
Files are written only into a folder of this process's user that nobody else may write
(secure_folder), through exclusive, non-following opens of a temporary name (write_file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import os
import pathlib
import secrets
import stat
from collections.abc import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVING_DAYS = 365
RENEW_AFTER_SHARE = 2 / 3  # renew once this share of the lifetime has passed


class CertificateError(ValueError):
    """A certificate or key is missing, unreadable, or does not fit; the message says which file."""


@dataclasses.dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key (cryptography objects)."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        """The certificate, PEM-encoded."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The private key, PEM-encoded (PKCS#8, unencrypted)."""
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The DNS names the kube-apiserver may use for a Service: svc, svc.ns, svc.ns.svc, svc.ns.svc.cluster.local."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def generate_ca(*, common_name: str = "dra-guard-ca", days: int = CA_DAYS, now: datetime.datetime | None = None) -> KeyPair:
    """A new self-signed CA (basicConstraints CA:TRUE, keyCertSign) valid for `days` days from `now`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = now or _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert=cert, key=key)


def generate_serving(
    ca: KeyPair,
    *,
    dns_names: Iterable[str],
    ip_addresses: Iterable[str] = (),
    days: int = SERVING_DAYS,
    now: datetime.datetime | None = None,
) -> KeyPair:
    """A serving certificate signed by `ca` with SANs for `dns_names` and `ip_addresses`.

    Raises CertificateError when no name is given (a certificate without SANs is useless to Go clients).
    """
    dns = list(dict.fromkeys(dns_names))
    ips = [ipaddress.ip_address(ip) for ip in dict.fromkeys(ip_addresses)]
    if not dns and not ips:
        raise CertificateError("a serving certificate needs at least one DNS name or IP address")
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or _now()
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ip) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[0] if dns else str(ips[0]))]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return KeyPair(cert=cert, key=key)


def needs_renewal(cert: x509.Certificate, *, share: float = RENEW_AFTER_SHARE, now: datetime.datetime | None = None) -> bool:
    """Whether more than `share` (0..1) of the certificate's lifetime has passed, or it has expired."""
    now = now or _now()
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= start + (end - start) * share


def sans_of(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    """(DNS names, IP addresses as strings) in the certificate's subjectAltName (empty sets if none)."""
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return set(ext.get_values_for_type(x509.DNSName)), {str(ip) for ip in ext.get_values_for_type(x509.IPAddress)}


def issued_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether `leaf` is signed by `ca` (signature and issuer name)."""
    try:
        leaf.verify_directly_issued_by(ca)
        return True
    except Exception:  # ValueError, TypeError or cryptography's InvalidSignature
        return False


class UnsafeFolderError(CertificateError):
    """A folder dra-guard would write keys into is not its own, or others may write into it."""


def secure_folder(directory: pathlib.Path) -> pathlib.Path:
    """Create `directory` (mode 0700, parents as needed) or check the one there; return it.

    A folder that is not a directory, is owned by another user than this process's effective
    user, or is group- or world-writable is refused with UnsafeFolderError naming it: whoever
    else may write there could plant a symlink or swap a key between our writes. (Kubernetes
    makes every emptyDir mode 0777, so point certificates.dir at a subfolder of the mount: the
    chart mounts one at /run/dra-guard and uses /run/dra-guard/certs.) An OSError while creating
    it is a CertificateError naming the folder.
    """
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(directory)
    except OSError as exc:
        raise CertificateError(f"{directory}: cannot create the certificate folder ({exc.strerror or exc})") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolderError(f"{directory}: not a directory; refusing to write certificates and keys there")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeFolderError(
            f"{directory}: owned by uid {st.st_uid}, not by this process (uid {uid}); "
            "refusing to write certificates and keys there (use a folder of our own)"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFolderError(
            f"{directory}: group- or world-writable (mode {stat.S_IMODE(st.st_mode):o}); "
            "refusing to write certificates and keys there (chmod go-w, or use a subfolder)"
        )
    return directory


def write_file(path: pathlib.Path, data: bytes, *, private: bool) -> None:
    """Write `data` to `path` atomically; mode 0600 when private (keys), else 0644.

    The folder must pass secure_folder. The bytes go to a new temporary file of a random name in
    the same folder, opened O_CREAT|O_EXCL|O_NOFOLLOW (a planted file or symlink of that name is
    never followed or reused: the open fails), then os.replace puts it in place of `path` (a
    symlink at `path` is replaced, its target never written). Raises UnsafeFolderError or OSError.
    """
    secure_folder(path.parent)
    mode = 0o600 if private else 0o644
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # exactly this mode, whatever the umask
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bundle(directory: pathlib.Path, *, ca: KeyPair, serving: KeyPair) -> None:
    """Write ca.crt, ca.key, tls.crt, tls.key into `directory` (created 0700 if needed; refused
    unless ours and not group/world-writable, see secure_folder), atomically per file (write_file)."""
    secure_folder(directory)
    write_file(directory / "ca.key", ca.key_pem(), private=True)
    write_file(directory / "ca.crt", ca.cert_pem(), private=False)
    write_file(directory / "tls.key", serving.key_pem(), private=True)
    write_file(directory / "tls.crt", serving.cert_pem(), private=False)


def load_pair(cert_path: pathlib.Path, key_path: pathlib.Path) -> KeyPair:
    """Read a PEM certificate and key. Raises CertificateError naming the file that is wrong."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CertificateError(f"{cert_path}: not a readable PEM certificate ({exc})") from exc
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise CertificateError(f"{key_path}: not a readable unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return KeyPair(cert=cert, key=key)  # type: ignore[arg-type]  # RSA keys from files mode are fine to serve
    return KeyPair(cert=cert, key=key)


def ensure_self_signed(directory: pathlib.Path, *, dns_names: Iterable[str], ip_addresses: Iterable[str] = ()) -> pathlib.Path:
    """Create (or reuse) a development CA and serving certificate in `directory`; return ca.crt's path.

    Reuses the files when the serving certificate chains to the CA, covers every requested name
    and is not yet due for renewal; otherwise makes new ones (a new CA only when the CA is
    missing, unreadable or itself due for renewal). Raises UnsafeFolderError for a folder that
    is not ours or is group/world-writable (secure_folder).
    """
    secure_folder(directory)  # never read keys from, or write them into, a folder others control
    dns, ips = list(dns_names), list(ip_addresses)
    ca: KeyPair | None = None
    try:
        ca = load_pair(directory / "ca.crt", directory / "ca.key")
        if needs_renewal(ca.cert):
            ca = None
    except CertificateError:
        ca = None
    if ca is not None:
        try:
            serving = load_pair(directory / "tls.crt", directory / "tls.key")
            have_dns, have_ips = sans_of(serving.cert)
            if (
                serving.cert.issuer == ca.cert.subject
                and set(dns) <= have_dns
                and set(ips) <= have_ips
                and not needs_renewal(serving.cert)
            ):
                serving.cert.verify_directly_issued_by(ca.cert)
                return directory / "ca.crt"
        except (CertificateError, ValueError, TypeError):
            pass
    ca = ca or generate_ca()
    write_bundle(directory, ca=ca, serving=generate_serving(ca, dns_names=dns, ip_addresses=ips))
    return directory / "ca.crt"
