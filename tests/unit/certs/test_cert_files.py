"""Certificate files on disk: exclusive, non-following writes, 0600 keys, and
no folder that is not ours or that others may write.

Each test plants what an attacker with write access to the folder (or the folder itself) would
and checks it is refused, never followed and never reused.
"""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

import certs
from certs.selfmanaged import Reconciler
from webhook.config import Config, from_mapping

CA = certs.generate_ca()
SERVING = certs.generate_serving(CA, dns_names=["localhost"])
NOBODY = 65534


def mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "certs"
    d.mkdir(mode=0o700)
    return d


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_keys_are_0600_and_certificates_0644_whatever_the_umask(folder, umask):
    old = os.umask(umask)
    try:
        certs.write_bundle(folder, ca=CA, serving=SERVING)
    finally:
        os.umask(old)
    assert {p.name: mode(p) for p in folder.iterdir()} == {
        "ca.key": 0o600,
        "tls.key": 0o600,
        "ca.crt": 0o644,
        "tls.crt": 0o644,
    }  # and no temporary file left


def test_a_new_folder_is_made_0700(tmp_path):
    target = tmp_path / "a" / "b"
    certs.write_bundle(target, ca=CA, serving=SERVING)
    assert mode(target) == 0o700


def test_a_symlink_planted_at_the_old_temporary_name_is_never_followed(folder, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    for name in ("tls.key", "ca.key", "tls.crt", "ca.crt"):
        (folder / f"{name}.tmp").symlink_to(victim)
    certs.write_bundle(folder, ca=CA, serving=SERVING)
    assert victim.read_bytes() == b"untouched"
    assert certs.load_pair(folder / "tls.crt", folder / "tls.key").cert == SERVING.cert


def test_a_symlink_at_the_destination_is_replaced_not_written_through(folder, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    (folder / "tls.key").symlink_to(victim)
    certs.write_file(folder / "tls.key", SERVING.key_pem(), private=True)
    assert victim.read_bytes() == b"untouched"
    assert not (folder / "tls.key").is_symlink() and mode(folder / "tls.key") == 0o600


def test_a_planted_file_or_symlink_at_the_temporary_name_makes_the_write_fail(folder, tmp_path, monkeypatch):
    """Even if an attacker guessed the random temporary name: O_EXCL|O_NOFOLLOW fail, nothing is
    reused (a loose 0666 file keeps neither its mode nor gets our key) or followed."""
    monkeypatch.setattr(certs.secrets, "token_hex", lambda n: "guessed")
    loose = folder / ".tls.key.guessed.tmp"
    loose.write_bytes(b"planted")
    os.chmod(loose, 0o666)
    with pytest.raises(FileExistsError):
        certs.write_file(folder / "tls.key", SERVING.key_pem(), private=True)
    assert loose.read_bytes() == b"planted" and not (folder / "tls.key").exists()
    loose.unlink()
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    loose.symlink_to(victim)
    with pytest.raises(FileExistsError):
        certs.write_file(folder / "tls.key", SERVING.key_pem(), private=True)
    assert victim.read_bytes() == b"untouched"


def test_a_loose_key_file_in_place_is_replaced_by_a_0600_one(folder):
    (folder / "tls.key").write_bytes(b"old")
    os.chmod(folder / "tls.key", 0o666)
    before = os.lstat(folder / "tls.key").st_ino
    certs.write_file(folder / "tls.key", SERVING.key_pem(), private=True)
    assert mode(folder / "tls.key") == 0o600 and os.lstat(folder / "tls.key").st_ino != before


@pytest.mark.parametrize("loose", [0o777, 0o770, 0o1777, 0o720, 0o702])
def test_a_group_or_world_writable_folder_is_refused_naming_it(folder, loose):
    os.chmod(folder, loose)
    for write in (
        lambda: certs.write_bundle(folder, ca=CA, serving=SERVING),
        lambda: certs.write_file(folder / "tls.key", SERVING.key_pem(), private=True),
        lambda: certs.ensure_self_signed(folder, dns_names=["localhost"]),
    ):
        with pytest.raises(certs.UnsafeFolderError, match=f"{folder}: group- or world-writable"):
            write()
    assert list(folder.iterdir()) == []


def test_a_folder_of_another_owner_is_refused_naming_it(folder, monkeypatch):
    if os.geteuid() == 0:
        os.chown(folder, NOBODY, NOBODY)  # really another owner
    else:
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(folder).st_uid + 1)
    with pytest.raises(certs.UnsafeFolderError, match=f"{folder}: owned by uid"):
        certs.write_bundle(folder, ca=CA, serving=SERVING)
    with pytest.raises(certs.UnsafeFolderError, match="owned by uid"):
        certs.ensure_self_signed(folder, dns_names=["localhost"])
    assert list(folder.iterdir()) == []


def test_a_file_where_the_folder_should_be_is_refused(tmp_path):
    (tmp_path / "certs").write_bytes(b"")
    with pytest.raises(certs.CertificateError, match="certs"):
        certs.write_bundle(tmp_path / "certs", ca=CA, serving=SERVING)


def test_self_mode_reconciler_refuses_a_world_writable_dir(tmp_path):
    from tests.unit.certs.test_selfmanaged_certs import FakeCertApi

    d = tmp_path / "certs"
    d.mkdir()
    os.chmod(d, 0o777)
    settings = from_mapping({"certificates": {"mode": "self", "namespace": "dra-guard", "dir": str(d)}}).certificates
    rec = Reconciler(FakeCertApi(), settings, identity="a")
    with pytest.raises(certs.UnsafeFolderError, match=str(d)):
        rec.reconcile()
    assert list(d.iterdir()) == []


def test_the_default_certificate_folder_is_not_under_tmp():
    folder = pathlib.PurePosixPath(Config().certificates.dir)
    assert folder.is_absolute() and not folder.is_relative_to("/tmp") and not folder.is_relative_to("/var/tmp")
