"""ReloadingContext: readiness follows the certificate files; changes are picked up by digest."""

from __future__ import annotations

import datetime
import logging

import certs
from certs.reload import ReloadingContext


def test_not_ready_until_a_valid_certificate_is_loaded(tmp_path):
    loaded = []
    rc = ReloadingContext(tmp_path / "tls.crt", tmp_path / "tls.key", interval_seconds=0, on_load=loaded.append)
    ok, why = rc.status()
    assert not ok and "cannot read" in why
    ca = certs.generate_ca()
    certs.write_bundle(tmp_path, ca=ca, serving=certs.generate_serving(ca, dns_names=["a"]))
    assert rc.status() == (True, "")
    assert len(loaded) == 1
    rc.context()
    assert len(loaded) == 1  # same digest: no reload
    certs.write_bundle(tmp_path, ca=ca, serving=certs.generate_serving(ca, dns_names=["b"]))
    rc.context()
    assert len(loaded) == 2 and certs.sans_of(loaded[-1])[0] == {"b"}


def test_expired_certificate_is_not_ready(tmp_path):
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=400)
    ca = certs.generate_ca(now=past)
    certs.write_bundle(tmp_path, ca=ca, serving=certs.generate_serving(ca, dns_names=["a"], days=30, now=past))
    ok, why = ReloadingContext(tmp_path / "tls.crt", tmp_path / "tls.key").status()
    assert not ok and "not valid now" in why


def test_mismatched_pair_keeps_the_previous_context_and_logs(tmp_path, caplog):
    ca = certs.generate_ca()
    certs.write_bundle(tmp_path, ca=ca, serving=certs.generate_serving(ca, dns_names=["a"]))
    rc = ReloadingContext(tmp_path / "tls.crt", tmp_path / "tls.key", interval_seconds=0)
    first = rc.context()
    other = certs.generate_serving(ca, dns_names=["b"])
    (tmp_path / "tls.crt").write_bytes(other.cert_pem())  # the key is not rewritten yet
    with caplog.at_level(logging.ERROR, logger="dra_guard.certs"):
        assert rc.context() is first
    assert any("keeping the previous" in r.getMessage() for r in caplog.records)
