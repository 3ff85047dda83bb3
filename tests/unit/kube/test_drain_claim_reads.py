"""How often `dra-guard drain` asks the API about each claim (webhook.kube.nodeview.Reader): in
every round while the node's pods naming it change, backing off to CLAIM_REREAD_MAX_SECONDS while
they do not (a drain held for an hour by a PodDisruptionBudget must not GET each claim every
second). The API here is a stand-in for webhook.kube.nodeapi.NodeApi's reads (pure caching policy)."""

from __future__ import annotations

from webhook.config import from_mapping
from webhook.kube.nodeview import CLAIM_REREAD_MAX_SECONDS, Reader


class Reads:
    """NodeApi's reads the Reader makes, answering from dicts and counting claim GETs."""

    node = "node-a"

    def __init__(self, claim):
        self.claim, self.gets = claim, 0

    def list_rbac(self):
        return []

    def get_claim(self, namespace, name):
        self.gets += 1
        return self.claim

    def get_pod(self, namespace, name):
        return None

    def get_daemonset(self, namespace, name):
        return None

    def list_slices(self):
        return []


def consumer(rv):
    return {
        "metadata": {"name": "c", "namespace": "work", "uid": "u1", "resourceVersion": rv},
        "spec": {"nodeName": "node-a", "resourceClaims": [{"name": "gpu", "resourceClaimName": "claim"}]},
        "status": {"phase": "Running"},
    }


CLAIM = {
    "metadata": {"name": "claim", "namespace": "work"},
    "status": {"reservedFor": [{"resource": "pods", "name": "c", "uid": "u1"}]},
}
NODE = {"metadata": {"name": "node-a"}}


def test_a_claim_whose_pods_do_not_change_is_read_less_and_less_often_and_at_once_when_they_do():
    api, t = Reads(CLAIM), [0.0]
    reader = Reader(api, from_mapping(None), clock=lambda: t[0])
    reads_at = []
    for second in range(60):  # an hour's drain held by a PDB, in one-second rounds
        t[0] = float(second)
        before = api.gets
        reader.read(NODE, [consumer("1")])
        if api.gets > before:
            reads_at.append(second)
    assert reads_at[:4] == [0, 1, 3, 7]  # 1, 2, 4 s apart, then every CLAIM_REREAD_MAX_SECONDS
    assert all(b - a <= CLAIM_REREAD_MAX_SECONDS for a, b in zip(reads_at, reads_at[1:], strict=False))
    assert len(reads_at) <= 60 / CLAIM_REREAD_MAX_SECONDS + 4
    # the pod changed (e.g. it started terminating): read in this very round
    t[0] = 60.5
    before = api.gets
    reader.read(NODE, [consumer("2")])
    assert api.gets == before + 1
    # the pod left: read again at once; released, the claim is no longer asked about
    api.claim = {"metadata": CLAIM["metadata"], "status": {}}
    t[0] = 61.0
    reader.read(NODE, [])
    assert api.gets == before + 2
    t[0] = 70.0
    reader.read(NODE, [])
    assert api.gets == before + 2
