"""`Facts`: what a policy may know about the cluster, one interface for `serve`, `audit` and
`drain-plan`.

Online, webhook.kube.state.ClusterState implements it from watches (and may make the two bounded
API reads the RBAC guard asks for). Offline, build_facts() makes one from listed objects or
manifest files: no API, every cache counts as synced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from webhook.config import Config
from webhook.model.claim_index import ClaimIndex
from webhook.model.rbac_index import RbacIndex


class Facts(Protocol):
    """The cluster as the policies see it.

    rbac: ClusterRoles and ClusterRoleBindings. claims: DaemonSets, driver and claim-using Pods,
    allocated ResourceClaims, (claims.slices) which drivers publish ResourceSlices on which node
    and (claims.nodes) the Nodes' labels.
    """

    @property
    def rbac(self) -> RbacIndex:
        """The RBAC index."""
        ...

    @property
    def claims(self) -> ClaimIndex:
        """The claim index."""
        ...

    def fetch_cluster_role(self, name: str) -> Mapping[str, Any] | None:
        """ClusterRole `name` (a rbac.authorization.k8s.io/v1 dict) read from the API when it is
        missing from the index, or None when it does not exist; raises on API failure."""
        ...

    def refresh_bindings(self) -> str | None:
        """Bring every ClusterRoleBinding into `rbac` before a ClusterRole with protected write is
        judged; None when done in full, else a note for a warning; raises on API failure."""
        ...

    def synced(self, names: tuple[str, ...] | None = None) -> tuple[bool, str]:
        """(True, "") when every cache (or those named) is in sync, else (False, why)."""
        ...

    def fresh(self, max_age_seconds: float) -> tuple[bool, str]:
        """synced(), and no cache older than `max_age_seconds` (seconds) without news."""
        ...

    def service_account_writes_slices(self, namespace: str, name: str) -> bool:
        """Whether RBAC lets ServiceAccount namespace/name write ResourceSlices (a DRA driver sign)."""
        ...


class StaticFacts:
    """Facts over objects already at hand (files, one-shot lists): no API reads, always in sync."""

    def __init__(self, config: Config, rbac: RbacIndex | None = None) -> None:
        self.config = config
        self._rbac = rbac or RbacIndex()
        self._claims = ClaimIndex(config.detection, self.service_account_writes_slices)

    @property
    def rbac(self) -> RbacIndex:
        """The RBAC index."""
        return self._rbac

    @property
    def claims(self) -> ClaimIndex:
        """The claim index."""
        return self._claims

    def fetch_cluster_role(self, name: str) -> Mapping[str, Any] | None:
        """Nothing beyond the objects given: always None."""
        return None

    def refresh_bindings(self) -> str | None:
        """Nothing to refresh: always None."""
        return None

    def synced(self, names: tuple[str, ...] | None = None) -> tuple[bool, str]:
        """Always in sync."""
        return True, ""

    def fresh(self, max_age_seconds: float) -> tuple[bool, str]:
        """Always fresh."""
        return True, ""

    def service_account_writes_slices(self, namespace: str, name: str) -> bool:
        """Whether the index's ClusterRoleBindings give ServiceAccount namespace/name ResourceSlice write."""
        return self._rbac.service_account_may_write(namespace, name, "resourceslices", self.config.rbac)


def build_facts(objects: Iterable[Mapping[str, Any]], config: Config) -> StaticFacts:
    """StaticFacts from Kubernetes object dicts with `kind` set (manifest files or lists):
    ClusterRoles and ClusterRoleBindings into `rbac`; DaemonSets, Pods, ResourceSlices, Nodes and
    ResourceClaims into `claims` (claims last, so usable-anywhere claims find their pods). Other kinds are ignored."""
    facts = StaticFacts(config)
    add_objects(facts, objects)
    return facts


def add_objects(facts: Facts, objects: Iterable[Mapping[str, Any]]) -> None:
    """Put object dicts with `kind` set into the indexes of `facts`, each replacing the indexed
    object of the same kind, namespace and name (e.g. manifest files over what `dra-guard audit
    --cluster` streamed from the cluster: "what if I applied these files"). RBAC kinds into
    `rbac`; DaemonSets, Pods, ResourceSlices and Nodes, then ResourceClaims (claims find their
    pods and nodes) into `claims`. Other kinds are ignored."""
    objects = list(objects)
    for obj in objects:
        kind = obj.get("kind")
        if facts.rbac.upsert(obj):
            continue
        if kind == "DaemonSet":
            facts.claims.upsert_daemonset(obj)
        elif kind == "Pod":
            facts.claims.upsert_pod(obj)
        elif kind == "ResourceSlice":
            facts.claims.slices.upsert(obj)
        elif kind == "Node":
            facts.claims.nodes.upsert(obj)
    for obj in objects:
        if obj.get("kind") == "ResourceClaim":
            facts.claims.upsert_claim(obj)
