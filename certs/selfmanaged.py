"""`certificates.mode: self`: dra-guard keeps its own CA, serving certificate and caBundles right.

Everything lives in one Secret in dra-guard's namespace (keys ca.crt, ca.key, tls.crt, tls.key and
ca-bundle.crt, the CAs the apiserver must trust, current first), so every replica serves a
certificate from the same CA. The first replica creates it; a 409 on create means another replica
won the race, and its Secret is read back (create-or-get). Later writes — renewal, CA rotation,
caBundle patches — are made by one replica at a time, the holder of a coordination.k8s.io Lease.

CA rotation is done in three reconcile steps so that the apiserver never sees a certificate it
does not trust:
  A. the CA is due: a new CA becomes current, the trust bundle is [new, old]; the serving
     certificate stays (it chains to the old CA, still trusted); caBundles are patched;
  B. once every webhook's caBundle holds the new CA, a serving certificate from the new CA is issued;
  C. once every live replica reports (through its own "serving" Lease) that it has served a leaf
     from the new CA for at least one reload interval, the old CA is dropped from the bundle.
A serving certificate is also re-issued when it is due (configurable share of its lifetime,
default 2/3) or lacks a required name. caBundles are set whenever they differ from the bundle,
not only when empty.

With `webhooksConfigMap` set (the chart does in self mode) the webhook configurations are
reconciled whole, not only their caBundle: every replica compares them with the webhooks the chart
rendered (that ConfigMap's key `webhooks.json`, read each round, so a `helm upgrade` or rollback
moves every replica to the new webhooks at once), reports any difference (on_drift), and the Lease
holder restores them (see certs.webhookspec). A configuration that was deleted is left deleted:
deleting it is the documented break-glass.

The Kubernetes calls go through a CertApi (certs.ports; webhook.kube.certapi.KubeCertApi in
production), so this module holds the decisions only: the Secret's contents are certs.bundle, what
each replica serves is told through Leases of its own (certs.replicas), the webhooks' comparison
with the chart's is certs.webhookspec.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import pathlib
from collections.abc import Callable
from typing import Any

from cryptography import x509

import certs
from certs import replicas, webhookspec
from certs.bundle import Bundle, fingerprint, pem_certs
from certs.ports import CertApi, CertSettings, Conflict

log = logging.getLogger("dra_guard.certs")


class Reconciler:
    """One replica's view of `certificates.mode: self`; call reconcile() every checkIntervalSeconds.

    api: a CertApi. config: CertSettings (webhook.config.CertificatesConfig, namespace already resolved). identity: this
    replica's name (pod name; unique per process). now: a clock, for tests.
    """

    def __init__(
        self,
        api: CertApi,
        config: CertSettings,
        *,
        identity: str,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.api = api
        self.config = config
        self.identity = identity
        self.now = now
        self.dir = pathlib.Path(config.dir)
        self.dns_names = [*certs.service_dns_names(config.service, config.namespace), *config.extra_dns_names]
        self.ip_addresses = list(config.extra_ip_addresses)
        self._serving_fp = ""
        self._serving_since = ""
        self.on_bundle: Callable[[Bundle], None] | None = None
        # (kind, configuration name, differences, restored by this replica): see certs.webhookspec.drift
        self.on_drift: Callable[[str, str, list[str], bool], None] | None = None

    # ------------------------------------------------------------------ building blocks
    def _ca_name(self) -> str:
        """A CA name unique per rotation: two CAs with one subject make TLS clients try the wrong one first."""
        return f"dra-guard-ca-{self.config.namespace}-{self.now().strftime('%Y%m%d%H%M%S')}"

    def _new_serving(self, ca: certs.KeyPair) -> certs.KeyPair:
        return certs.generate_serving(
            ca, dns_names=self.dns_names, ip_addresses=self.ip_addresses, days=self.config.leaf_validity_days, now=self.now()
        )

    def _fresh_bundle(self) -> Bundle:
        ca = certs.generate_ca(common_name=self._ca_name(), days=self.config.ca_validity_days, now=self.now())
        return Bundle(ca=ca, trusted=[ca.cert], serving=self._new_serving(ca))

    def get_or_create(self) -> Bundle:
        """Read the Secret, creating it when missing (a 409 means another replica did: read it back)."""
        secret = self.api.get_secret(self.config.secret_name)
        if secret is None:
            fresh = self._fresh_bundle()
            try:
                self.api.create_secret(self.config.secret_name, fresh.data())
                log.info("created the CA and serving certificate Secret", extra={"secret": self.config.secret_name})
            except Conflict:
                log.info("another replica created the certificate Secret first; using it")
            secret = self.api.get_secret(self.config.secret_name)
            if secret is None:
                raise RuntimeError(f"Secret {self.config.secret_name} vanished right after it was created")
        bundle = Bundle.from_secret(secret)
        if bundle is None:
            raise RuntimeError(f"Secret {self.config.secret_name} holds no readable ca.crt/ca.key; delete it to start over")
        return bundle

    def holds_lease(self) -> bool:
        """Take or renew the writers' Lease; True when this replica may write now."""
        return self.api.hold_lease(
            self.config.lease_name,
            identity=self.identity,
            now=self.now(),
            duration_seconds=max(15, 2 * self.config.check_interval_seconds),
        )

    def _cluster_bundles(self) -> list[list[bytes]]:
        out = []
        for kind, name in (("validating", self.config.validating_webhook), ("mutating", self.config.mutating_webhook)):
            bundles = self.api.webhook_ca_bundles(kind, name)
            if bundles is not None:
                out.append(bundles)
        return out

    def _all_webhooks_trust(self, ca: x509.Certificate) -> bool:
        for bundles in self._cluster_bundles():
            for raw in bundles:
                if fingerprint(ca) not in {fingerprint(c) for c in pem_certs(raw)}:
                    return False
        return True

    def _replicas_serve(self, ca: x509.Certificate) -> bool:
        return replicas.all_serve(
            self.api,
            self.config.lease_name,
            fingerprint(ca),
            settle_seconds=self.config.reload_interval_seconds,
            now=self.now(),
        )

    # ------------------------------------------------------------------ the loop body
    def plan(self, bundle: Bundle) -> tuple[Bundle, str] | None:
        """The next change to the Secret, as (new bundle, reason), or None when nothing is due."""
        share = self.config.renew_after_share
        leaf = bundle.serving
        if len(bundle.trusted) == 1 and certs.needs_renewal(bundle.ca.cert, share=share, now=self.now()):
            new_ca = certs.generate_ca(common_name=self._ca_name(), days=self.config.ca_validity_days, now=self.now())
            return Bundle(ca=new_ca, trusted=[new_ca.cert, bundle.ca.cert], serving=leaf), "CA rotation step A: new CA trusted"
        if leaf is None or not certs.issued_by(leaf.cert, bundle.ca.cert):
            if leaf is not None and not self._all_webhooks_trust(bundle.ca.cert):
                return None  # wait for the caBundles to carry the new CA (patched below)
            return dataclasses.replace(bundle, serving=self._new_serving(bundle.ca)), "serving certificate from the current CA"
        have_dns, have_ips = certs.sans_of(leaf.cert)
        if (
            certs.needs_renewal(leaf.cert, share=share, now=self.now())
            or not set(self.dns_names) <= have_dns
            or not set(self.ip_addresses) <= have_ips
        ):
            return dataclasses.replace(bundle, serving=self._new_serving(bundle.ca)), "serving certificate renewal"
        if len(bundle.trusted) > 1 and self._replicas_serve(bundle.ca.cert):
            return dataclasses.replace(bundle, trusted=[bundle.ca.cert]), "CA rotation step C: old CA dropped"
        return None

    def reconcile(self) -> Bundle:
        """One round: get-or-create, planned Secret change and caBundle patches (under the Lease),
        write the serving files, report what this replica serves. Returns the bundle in force."""
        bundle = self.get_or_create()
        change = self.plan(bundle)
        leader = self.holds_lease()
        if leader:
            self.prune_serving_leases()
        if change is not None:
            if leader:
                new, reason = change
                try:
                    self.api.update_secret(self.config.secret_name, new.data(), bundle.resource_version)
                    log.info("certificate Secret updated", extra={"reason": reason, "secret": self.config.secret_name})
                except Conflict:
                    log.info("certificate Secret changed meanwhile; next round", extra={"reason": reason})
                bundle = self.get_or_create()
        wanted = bundle.trust_pem()
        self.reconcile_webhooks(wanted, leader=leader)
        stale = any(raw != wanted for bundles in self._cluster_bundles() for raw in bundles)
        if stale:
            if leader:
                for kind, name in (("validating", self.config.validating_webhook), ("mutating", self.config.mutating_webhook)):
                    if self.api.webhook_ca_bundles(kind, name) is not None:
                        self.api.set_webhook_ca_bundles(kind, name, wanted)
                log.info("caBundle set on the webhook configurations")
        self.write_files(bundle)
        self.report_serving()
        if self.on_bundle is not None:
            self.on_bundle(bundle)
        return bundle

    def desired_webhooks(self) -> dict[str, list[dict[str, Any]]] | None:
        """The chart's webhooks ({"validating": [...], "mutating": [...]}) from the ConfigMap
        `webhooks_config_map`, key webhooks.json; None when not configured or not there (then only
        caBundle is kept). Raises ValueError when webhooks.json is malformed."""
        if not self.config.webhooks_config_map:
            return None
        data = self.api.get_config_map(self.config.webhooks_config_map)
        if data is None or "webhooks.json" not in data:
            log.warning(
                "no webhooks.json in the ConfigMap; only caBundle is reconciled",
                extra={"configmap": self.config.webhooks_config_map},
            )
            return None
        return webhookspec.parse_desired(data["webhooks.json"])

    def reconcile_webhooks(self, ca_bundle: bytes, *, leader: bool) -> None:
        """Compare both webhook configurations whole with desired_webhooks(); report each
        difference through on_drift and, on the Lease holder, replace their `webhooks` with the
        desired ones carrying `ca_bundle` (PEM). A deleted configuration is left deleted."""
        desired = self.desired_webhooks()
        if desired is None:
            return
        for kind, name in (("validating", self.config.validating_webhook), ("mutating", self.config.mutating_webhook)):
            live = self.api.webhook_configuration(kind, name)
            if live is None:
                continue
            differences = webhookspec.drift(live.get("webhooks") or [], desired[kind], kind)
            restored = False
            if differences and leader:
                try:
                    self.api.replace_webhooks(
                        kind,
                        name,
                        webhookspec.restored(desired[kind], ca_bundle),
                        str((live.get("metadata") or {}).get("resourceVersion", "")),
                    )
                    restored = True
                except Conflict:
                    log.info("webhook configuration changed meanwhile; next round", extra={"configuration": name})
            if differences:
                log.warning(
                    "webhook configuration differs from the chart's webhooks",
                    extra={"kind": kind, "configuration": name, "differences": differences, "restored": restored},
                )
            if self.on_drift is not None:
                self.on_drift(kind, name, differences, restored)

    def write_files(self, bundle: Bundle) -> bool:
        """Write tls.crt, tls.key and ca.crt (the trust bundle) to config.dir when they differ.

        A serving certificate whose CA the webhooks' caBundles do not trust yet is not served (the
        writer replica patches the caBundles first); the files in place keep serving meanwhile.
        Returns True when files changed.
        """
        if bundle.serving is None:
            return False
        issuer = next((c for c in bundle.trusted if certs.issued_by(bundle.serving.cert, c)), None)
        files = {"tls.crt": bundle.serving.cert_pem(), "tls.key": bundle.serving.key_pem(), "ca.crt": bundle.trust_pem()}
        certs.secure_folder(self.dir)  # ours, 0700: see certs.secure_folder
        current = {}
        for name in files:
            try:
                current[name] = (self.dir / name).read_bytes()
            except OSError:
                current[name] = b""
        if current == files:
            return False
        if (
            current["tls.crt"]
            and current["tls.crt"] != files["tls.crt"]
            and (issuer is None or not self._all_webhooks_trust(issuer))
        ):
            log.info("new serving certificate held back until every caBundle trusts its CA")
            return False
        # key before certificate: ReloadingContext refuses a mismatched pair, so a reader in
        # between keeps the previous certificate
        for name in ("tls.key", "tls.crt", "ca.crt"):
            if current[name] != files[name]:
                certs.write_file(self.dir / name, files[name], private=name.endswith(".key"))
        fp = fingerprint(issuer) if issuer is not None else ""
        if fp != self._serving_fp:
            self._serving_fp, self._serving_since = fp, replicas.micro_time(self.now())
        return True

    def prune_serving_leases(self) -> None:
        """Delete serving Leases of replicas gone for more than their lease duration (certs.replicas.prune)."""
        replicas.prune(self.api, self.config.lease_name, now=self.now())

    def report_serving(self) -> None:
        """Renew this replica's serving Lease with the fingerprint of the CA its leaf chains to (certs.replicas.report)."""
        replicas.report(
            self.api,
            self.config.lease_name,
            identity=self.identity,
            fingerprint=self._serving_fp,
            since=self._serving_since,
            duration_seconds=3 * self.config.check_interval_seconds,
            now=self.now(),
        )
