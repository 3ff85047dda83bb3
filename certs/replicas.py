"""What each replica serves, told through Leases of its own (`certificates.mode: self`).

Every replica renews a "serving" Lease (`<leaseName>-serving-<identity>`, label SERVING_LABEL)
annotated with the fingerprint of the CA its serving certificate chains to and since when. The
writer replica reads them before the last step of a CA rotation (the old CA leaves the trust
bundle only once every live replica has served from the new CA for a reload interval), and
deletes those of replicas gone (pod churn).
"""

from __future__ import annotations

import datetime
from typing import Any

from certs.ports import CertApi, Conflict

SERVING_LABEL = "dra-guard.io/serving-lease-of"
SERVING_CA_ANNOTATION = "dra-guard.io/serving-ca"
SERVING_SINCE_ANNOTATION = "dra-guard.io/serving-since"


def micro_time(t: datetime.datetime) -> str:
    """A Lease MicroTime string ("2026-12-01T10:00:00.000000Z") for aware datetime `t`."""
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> datetime.datetime | None:
    """The aware datetime of a Lease MicroTime or RFC 3339 string; None when missing or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def all_serve(api: CertApi, lease_name: str, fingerprint: str, *, settle_seconds: int, now: datetime.datetime) -> bool:
    """Whether every live replica (serving Lease of `lease_name` renewed within its duration) has
    served a leaf from the CA of `fingerprint` for at least `settle_seconds`, and there is one."""
    settle = datetime.timedelta(seconds=settle_seconds)
    live = 0
    for lease in api.list_leases(f"{SERVING_LABEL}={lease_name}"):
        spec, meta = lease.get("spec") or {}, lease.get("metadata") or {}
        renewed = parse_time(spec.get("renewTime"))
        if renewed is None or renewed + datetime.timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0)) < now:
            continue
        live += 1
        annotations = meta.get("annotations") or {}
        since = parse_time(annotations.get(SERVING_SINCE_ANNOTATION))
        if annotations.get(SERVING_CA_ANNOTATION) != fingerprint or since is None or since + settle > now:
            return False
    return live > 0


def prune(api: CertApi, lease_name: str, *, now: datetime.datetime) -> None:
    """Delete the serving Leases of replicas gone for more than their lease duration (pod churn)."""
    for lease in api.list_leases(f"{SERVING_LABEL}={lease_name}"):
        spec = lease.get("spec") or {}
        renewed = parse_time(spec.get("renewTime"))
        if renewed is None or renewed + datetime.timedelta(seconds=2 * int(spec.get("leaseDurationSeconds") or 0)) < now:
            api.delete_lease(str((lease.get("metadata") or {}).get("name")))


def report(
    api: CertApi,
    lease_name: str,
    *,
    identity: str,
    fingerprint: str,
    since: str,
    duration_seconds: int,
    now: datetime.datetime,
) -> None:
    """Create or renew replica `identity`'s serving Lease: it serves from the CA of `fingerprint`
    (hex SHA-256; "" when none) since `since` (MicroTime), for `duration_seconds`. A 409 (another
    write meanwhile) is left for the next round."""
    name = f"{lease_name}-serving-{identity}"[:253]
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": {SERVING_LABEL: lease_name},
            "annotations": {SERVING_CA_ANNOTATION: fingerprint, SERVING_SINCE_ANNOTATION: since},
        },
        "spec": {"holderIdentity": identity, "renewTime": micro_time(now), "leaseDurationSeconds": duration_seconds},
    }
    try:
        lease = api.get_lease(name)
        if lease is None:
            api.create_lease(body)
        else:
            api.update_lease({**lease, "metadata": {**(lease.get("metadata") or {}), **body["metadata"]}, "spec": body["spec"]})
    except Conflict:
        pass
