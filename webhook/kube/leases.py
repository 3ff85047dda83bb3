"""Holding a coordination.k8s.io/v1 Lease: one writer at a time among dra-guard's replicas.

hold_lease() takes or renews a Lease for one holder, release_lease() gives it up (at shutdown, so
that another replica need not wait out its duration): the certificate writers' Lease of
`certificates.mode: self` (certs.selfmanaged.Reconciler, through its CertApi port) and the
periodic audit's (webhook.serve.periodic). The calls go through the port's get_lease,
create_lease and update_lease (webhook.kube.certapi.KubeCertApi over the API; a fake in unit tests).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Protocol

from certs.ports import Conflict
from certs.replicas import micro_time, parse_time  # the Lease time format, one definition


class LeaseCalls(Protocol):
    """The Lease calls hold_lease makes, in one namespace: coordination.k8s.io/v1 dicts; create and
    update raise certs.ports.Conflict on 409; get returns None when there is none."""

    def get_lease(self, name: str) -> dict[str, Any] | None: ...
    def create_lease(self, lease: Mapping[str, Any]) -> None: ...
    def update_lease(self, lease: Mapping[str, Any]) -> None: ...


def hold_lease(api: LeaseCalls, name: str, *, identity: str, now: datetime.datetime, duration_seconds: int) -> bool:
    """Take or renew the Lease `name` for `identity` at `now`; True when it holds it now.

    A Lease held by someone else and renewed within its leaseDurationSeconds is left alone; an
    expired one is taken over. Concurrent takers are serialised by resourceVersion (409 = lost).
    """
    lease = api.get_lease(name)
    spec = {"holderIdentity": identity, "leaseDurationSeconds": duration_seconds, "renewTime": micro_time(now)}
    try:
        if lease is None:
            api.create_lease({"metadata": {"name": name}, "spec": {**spec, "acquireTime": micro_time(now)}})
            return True
        current = lease.get("spec") or {}
        renewed = parse_time(current.get("renewTime"))
        expired = (
            renewed is None
            or renewed + datetime.timedelta(seconds=int(current.get("leaseDurationSeconds") or duration_seconds)) < now
        )
        if current.get("holderIdentity") not in (identity, None, "") and not expired:
            return False
        acquire = current.get("acquireTime") if current.get("holderIdentity") == identity else micro_time(now)
        api.update_lease({**lease, "spec": {**current, **spec, "acquireTime": acquire}})
        return True
    except Conflict:
        return False


def release_lease(api: LeaseCalls, name: str, *, identity: str) -> bool:
    """Give up the Lease `name` if `identity` holds it (holderIdentity emptied: the next
    hold_lease of anyone takes it at once); True when it was released. A Lease held by another, or
    missing, is left alone; a concurrent change (409) wins."""
    lease = api.get_lease(name)
    current = (lease or {}).get("spec") or {}
    if lease is None or current.get("holderIdentity") != identity:
        return False
    try:
        api.update_lease({**lease, "spec": {**current, "holderIdentity": ""}})
    except Conflict:
        return False
    return True
