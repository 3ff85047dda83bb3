"""certificates.mode self: the reconciler's decisions over an in-memory CertApi (pure logic).

The real Kubernetes calls (KubeCertApi) are exercised in tests/e2e/test_certificates.py.
"""

from __future__ import annotations

import copy
import datetime

import pytest
from cryptography import x509

import certs
from certs.bundle import fingerprint
from certs.ports import Conflict
from certs.selfmanaged import Reconciler
from webhook.config import from_mapping
from webhook.kube import leases


class FakeCertApi:
    """Secrets, Leases and webhook caBundles in dicts, with resourceVersion conflicts like the apiserver."""

    def __init__(self):
        self.secrets = {}
        self.leases = {}
        self.bundles = {("validating", "dra-guard"): [b"", b""], ("mutating", "dra-guard"): [b""]}
        self.rv = 0
        self.writes = []
        self.race_on_create = False

    def _next(self):
        self.rv += 1
        return str(self.rv)

    def get_secret(self, name):
        s = self.secrets.get(name)
        return copy.deepcopy(s) if s else None

    def create_secret(self, name, data):
        if self.race_on_create:  # another replica's create lands between our get and our create
            self.race_on_create = False
            other = Reconciler(self, CONFIG, identity="other")._fresh_bundle()
            self.secrets[name] = {"data": other.data(), "resourceVersion": self._next()}
        if name in self.secrets:
            raise Conflict("exists")
        self.secrets[name] = {"data": dict(data), "resourceVersion": self._next()}
        self.writes.append(("create", name))

    def update_secret(self, name, data, resource_version):
        if self.secrets[name]["resourceVersion"] != resource_version:
            raise Conflict("changed")
        self.secrets[name] = {"data": dict(data), "resourceVersion": self._next()}
        self.writes.append(("update", name))

    def get_lease(self, name):
        return copy.deepcopy(self.leases.get(name))

    def create_lease(self, lease):
        name = lease["metadata"]["name"]
        if name in self.leases:
            raise Conflict("exists")
        self.leases[name] = {**copy.deepcopy(lease), "metadata": {**lease["metadata"], "resourceVersion": self._next()}}

    def update_lease(self, lease):
        name = lease["metadata"]["name"]
        if self.leases[name]["metadata"]["resourceVersion"] != lease["metadata"].get("resourceVersion"):
            raise Conflict("changed")
        self.leases[name] = {**copy.deepcopy(lease), "metadata": {**lease["metadata"], "resourceVersion": self._next()}}

    def list_leases(self, label_selector):
        key, _, value = label_selector.partition("=")
        return [copy.deepcopy(v) for v in self.leases.values() if (v["metadata"].get("labels") or {}).get(key) == value]

    def delete_lease(self, name):
        self.leases.pop(name, None)

    def hold_lease(self, name, **kwargs):
        return leases.hold_lease(self, name, **kwargs)  # the real take-or-renew over these dicts

    def webhook_ca_bundles(self, kind, name):
        return list(self.bundles[(kind, name)]) if (kind, name) in self.bundles else None

    def set_webhook_ca_bundles(self, kind, name, bundle):
        self.bundles[(kind, name)] = [bundle] * len(self.bundles[(kind, name)])
        self.writes.append(("caBundle", kind))


CONFIG = from_mapping(
    {"certificates": {"mode": "self", "namespace": "dra-guard", "extraIpAddresses": ["127.0.0.1"]}}
).certificates
T0 = datetime.datetime(2026, 11, 30, tzinfo=datetime.UTC)


class Clock:
    def __init__(self):
        self.t = T0 + datetime.timedelta(minutes=10)

    def __call__(self):
        return self.t


def replica(api, tmp_path, name, clock):
    cfg = from_mapping(
        {
            "certificates": {
                "mode": "self",
                "namespace": "dra-guard",
                "extraIpAddresses": ["127.0.0.1"],
                "dir": str(tmp_path / name),
            }
        }
    ).certificates
    return Reconciler(api, cfg, identity=name, now=clock)


def served(rec):
    return x509.load_pem_x509_certificate((rec.dir / "tls.crt").read_bytes())


def ca_of(api):
    return x509.load_pem_x509_certificate(api.secrets["dra-guard-tls"]["data"]["ca.crt"])


def test_two_replicas_racing_end_with_one_secret_and_one_ca(tmp_path):
    api, clock = FakeCertApi(), Clock()
    a, b = replica(api, tmp_path, "a", clock), replica(api, tmp_path, "b", clock)
    api.race_on_create = True  # b's create loses to a concurrent one
    b.reconcile()
    a.reconcile()
    assert len(api.secrets) == 1
    ca = ca_of(api)
    for rec in (a, b):
        leaf = served(rec)
        leaf.verify_directly_issued_by(ca)
        dns, ips = certs.sans_of(leaf)
        assert {"dra-guard.dra-guard.svc", "dra-guard.dra-guard.svc.cluster.local"} <= dns and "127.0.0.1" in ips


def test_stale_ca_bundle_is_corrected_in_one_round(tmp_path):
    api, clock = FakeCertApi(), Clock()
    rec = replica(api, tmp_path, "a", clock)
    rec.reconcile()
    stale = certs.generate_ca().cert_pem()
    api.bundles[("validating", "dra-guard")] = [stale, stale]  # someone put an old CA there
    rec.reconcile()
    want = api.secrets["dra-guard-tls"]["data"]["ca-bundle.crt"]
    assert api.bundles[("validating", "dra-guard")] == [want, want]
    assert api.bundles[("mutating", "dra-guard")] == [want]


def test_non_holder_does_not_write(tmp_path):
    api, clock = FakeCertApi(), Clock()
    a, b = replica(api, tmp_path, "a", clock), replica(api, tmp_path, "b", clock)
    a.reconcile()  # a holds the writers' lease now
    api.bundles[("mutating", "dra-guard")] = [b"stale"]
    b.reconcile()
    assert api.bundles[("mutating", "dra-guard")] == [b"stale"]
    clock.t += datetime.timedelta(seconds=2 * CONFIG.check_interval_seconds + 1)  # a's lease expires
    b.reconcile()
    assert api.bundles[("mutating", "dra-guard")] != [b"stale"]


def test_serving_certificate_is_renewed_after_two_thirds_with_the_same_ca(tmp_path):
    api, clock = FakeCertApi(), Clock()
    rec = replica(api, tmp_path, "a", clock)
    rec.reconcile()
    first = served(rec)
    clock.t += datetime.timedelta(days=200)  # < 2/3 of 365
    rec.reconcile()
    assert served(rec).serial_number == first.serial_number
    clock.t += datetime.timedelta(days=50)  # > 2/3 of 365 days
    rec.reconcile()
    second = served(rec)
    assert second.serial_number != first.serial_number
    second.verify_directly_issued_by(ca_of(api))


def test_ca_rotation_keeps_old_and_new_until_every_replica_serves_the_new(tmp_path):
    api, clock = FakeCertApi(), Clock()
    a, b = replica(api, tmp_path, "a", clock), replica(api, tmp_path, "b", clock)
    a.reconcile()
    b.reconcile()
    old_ca = ca_of(api)
    clock.t += datetime.timedelta(days=2500)  # > 2/3 of 3650 days; leaves renewed along the way below
    # step A: new CA trusted next to the old one; leaves still from the old CA; caBundles carry both
    a.reconcile()
    new_ca = ca_of(api)
    assert fingerprint(new_ca) != fingerprint(old_ca)
    bundle = x509.load_pem_x509_certificates(api.secrets["dra-guard-tls"]["data"]["ca-bundle.crt"])
    assert [fingerprint(c) for c in bundle] == [fingerprint(new_ca), fingerprint(old_ca)]
    assert all(len(x509.load_pem_x509_certificates(raw)) == 2 for raw in api.bundles[("validating", "dra-guard")])
    # step B: with every caBundle trusting the new CA, leaves come from it
    a.reconcile()
    b.reconcile()
    served(a).verify_directly_issued_by(new_ca)
    served(b).verify_directly_issued_by(new_ca)
    # not yet C: the replicas have served the new leaf for less than one reload interval
    a.reconcile()
    assert len(x509.load_pem_x509_certificates(api.secrets["dra-guard-tls"]["data"]["ca-bundle.crt"])) == 2
    clock.t += datetime.timedelta(seconds=CONFIG.reload_interval_seconds + 1)
    b.reconcile()  # b reports again (still serving the new CA)
    a.reconcile()  # step C
    bundle = x509.load_pem_x509_certificates(api.secrets["dra-guard-tls"]["data"]["ca-bundle.crt"])
    assert [fingerprint(c) for c in bundle] == [fingerprint(new_ca)]
    a.reconcile()
    assert all(raw == api.secrets["dra-guard-tls"]["data"]["ca-bundle.crt"] for raw in api.bundles[("validating", "dra-guard")])


def test_replica_still_on_old_ca_blocks_dropping_it(tmp_path):
    api, clock = FakeCertApi(), Clock()
    a, b = replica(api, tmp_path, "a", clock), replica(api, tmp_path, "b", clock)
    a.reconcile()
    b.reconcile()
    clock.t += datetime.timedelta(days=2500)
    a.reconcile()  # A
    b.reconcile()  # b cannot write (a holds the lease): it serves the old leaf and says so
    a.reconcile()  # B: a serves the new leaf
    clock.t += datetime.timedelta(seconds=CONFIG.reload_interval_seconds + 1)
    a.reconcile()
    assert len(x509.load_pem_x509_certificates(api.secrets["dra-guard-tls"]["data"]["ca-bundle.crt"])) == 2
    b.reconcile()  # b picks up the new leaf
    clock.t += datetime.timedelta(seconds=CONFIG.reload_interval_seconds + 1)
    b.reconcile()
    a.reconcile()  # now C
    assert len(x509.load_pem_x509_certificates(api.secrets["dra-guard-tls"]["data"]["ca-bundle.crt"])) == 1


def test_unreadable_secret_is_a_clear_error(tmp_path):
    api, clock = FakeCertApi(), Clock()
    api.secrets["dra-guard-tls"] = {"data": {"ca.crt": b"junk"}, "resourceVersion": "1"}
    with pytest.raises(RuntimeError, match="delete it to start over"):
        replica(api, tmp_path, "a", clock).reconcile()


def test_expired_serving_leases_are_pruned(tmp_path):
    api, clock = FakeCertApi(), Clock()
    a, b = replica(api, tmp_path, "a", clock), replica(api, tmp_path, "b", clock)
    a.reconcile()
    b.reconcile()
    assert "dra-guard-certs-serving-b" in api.leases
    clock.t += datetime.timedelta(seconds=7 * CONFIG.check_interval_seconds)  # b is gone
    a.reconcile()
    assert "dra-guard-certs-serving-b" not in api.leases and "dra-guard-certs-serving-a" in api.leases


def test_a_leaf_from_an_untrusted_ca_is_not_served_until_the_ca_bundles_trust_it(tmp_path):
    api, clock = FakeCertApi(), Clock()
    a, b = replica(api, tmp_path, "a", clock), replica(api, tmp_path, "b", clock)
    a.reconcile()
    b.reconcile()
    before = served(b)
    # someone (a restore, another tool) puts a leaf from an unknown CA into the Secret
    other = certs.generate_ca(now=clock.t)
    data = dict(api.secrets["dra-guard-tls"]["data"])
    leaf = certs.generate_serving(other, dns_names=["dra-guard.dra-guard.svc"], now=clock.t)
    data.update(
        {
            "ca.crt": other.cert_pem(),
            "ca.key": other.key_pem(),
            "ca-bundle.crt": other.cert_pem(),
            "tls.crt": leaf.cert_pem(),
            "tls.key": leaf.key_pem(),
        }
    )
    api.secrets["dra-guard-tls"] = {"data": data, "resourceVersion": api._next()}
    b.reconcile()  # b does not hold the lease: cannot patch the caBundles, must not serve the new leaf
    assert served(b).serial_number == before.serial_number
    a.reconcile()  # the writer patches the caBundles (and renews the leaf: it lacks names)
    b.reconcile()
    served(b).verify_directly_issued_by(other.cert)
