"""The shared record across replicas (webhook.model.leaving, webhook.kube.records): an allow on the
strength of a Ready peer while claims are held asks for it; whoever owns it first lets its pod
go, the other pod of the surge pair gets 429; a stale record is taken over, a retried eviction
keeps its own; a record that cannot be written refuses in enforce mode only.

LeaseRecords runs here over an in-memory LeaseApi with the apiserver's optimistic concurrency
(resourceVersion, 409); the real API: tests/e2e/test_replicas.py."""

from __future__ import annotations

import datetime
import json
import re
import threading
import time

import pytest

from tests.builders import claim, driver_daemonset, eviction_request, node_object, pod
from webhook import metrics
from webhook.config import from_mapping
from webhook.kube.errors import ClusterError
from webhook.kube.records import Conflict, LeaseRecords
from webhook.kube.state import ClusterState
from webhook.model.leaving import RECORD_PREFIX, LeaveRecord, judge, record_name
from webhook.policies import eviction
from webhook.serve.app import create_app

CONFIG = from_mapping(None).eviction
NOW = datetime.datetime(2026, 12, 1, 10, 0, 0, tzinfo=datetime.UTC)


def ready(p, *, terminating=False):
    p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    if terminating:
        p["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    return p


def replica(*, held=True, config=None):
    """One replica's ClusterState (no API): node-a with the surge pair gpu-driver-a / gpu-driver-a2,
    both Ready, and (held) a consumer's claim reserved there."""
    state = ClusterState(None, config=config or from_mapping(None))
    idx = state.claims
    idx.upsert_daemonset(driver_daemonset(name="gpu-driver", namespace="gpu"))
    idx.nodes.upsert({**node_object("node-a"), "metadata": {**node_object("node-a")["metadata"], "uid": "node-a-uid"}})
    for name in ("gpu-driver-a", "gpu-driver-a2"):
        idx.upsert_pod(ready(pod(name, "node-a", namespace="gpu", ds="gpu-driver")))
    if held:
        idx.upsert_pod(pod("consumer", "node-a"))
        idx.upsert_claim(claim("gpu"))
    return state


def decide(state, name, **kw):
    return eviction.review(eviction_request(name, **kw), index=state.claims, config=CONFIG)


# --------------------------------------------------------------------------- the policy asks for it


def test_an_allow_on_the_strength_of_a_peer_while_claims_are_held_asks_for_the_shared_record():
    decision = decide(replica(), "gpu-driver-a")
    assert decision.allowed and decision.record is not None
    lease = decision.record.lease
    assert lease.name == record_name("gpu", "gpu-driver", "node-a")
    assert lease.holder == "gpu/gpu-driver-a/uid-gpu-gpu-driver-a" and lease.peer == "gpu/gpu-driver-a2"
    assert lease.daemonset == "gpu/gpu-driver" and lease.node == "node-a" and lease.seconds == 30
    assert decision.record.conflict.code == 429 and decision.record.failed.code == 429


def test_no_record_without_held_claims_for_a_dry_run_or_for_a_pod_that_is_not_a_driver():
    assert decide(replica(held=False), "gpu-driver-a").record is None
    assert decide(replica(), "gpu-driver-a", dry_run=True).record is None
    state = replica()
    state.claims.upsert_pod(pod("plain", "node-a", namespace="gpu", claims=()))
    assert decide(state, "plain").record is None


def test_a_pod_refused_because_its_peer_is_leaving_here_asks_for_no_record():
    state = replica()
    assert decide(state, "gpu-driver-a").record is not None
    second = decide(state, "gpu-driver-a2")
    assert not second.allowed and second.record is None


@pytest.mark.parametrize("result", ["created", "renewed", "taken_over", "unrecorded"])
def test_an_owned_record_keeps_the_allow(result):
    settled = decide(replica(), "gpu-driver-a").settle(result)
    assert settled.allowed and settled.record is None and "seamless upgrade" in settled.warnings[0]


def test_a_record_another_pod_holds_refuses_with_the_surge_pair_message_and_the_holder():
    settled = decide(replica(), "gpu-driver-a").settle("conflict", "Lease dra-guard/x names gpu/gpu-driver-a2/u as leaving")
    (finding,) = settled.findings
    assert not settled.allowed and finding.code == 429 and finding.check == "driver-still-needed"
    assert "allowed to leave a moment ago" in finding.message and "one pod of a surge pair goes at a time" in finding.message
    assert "gpu/gpu-driver-a2/u" in finding.message and finding.details["claims"] == ["work/gpu"]


def test_a_record_that_could_not_be_written_refuses_saying_why_and_to_retry():
    settled = decide(replica(), "gpu-driver-a").settle("error", "Lease dra-guard/x not written: 403 Forbidden")
    (finding,) = settled.findings
    assert not settled.allowed and finding.code == 429 and finding.check == "leave-record-failed"
    assert "403 Forbidden" in finding.message and "retry" in finding.message


# --------------------------------------------------------------------------- what a record means


def record(pod_name="gpu-driver-a", uid="uid-a"):
    return LeaveRecord(
        name=record_name("gpu", "gpu-driver", "node-a"),
        namespace="gpu",
        pod=pod_name,
        uid=uid,
        daemonset="gpu/gpu-driver",
        node="node-a",
        peer="gpu/other",
        seconds=30,
    )


def spec(holder, renewed=NOW, seconds=30):
    return {"holderIdentity": holder, "leaseDurationSeconds": seconds, "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}


def test_judge_tells_a_retry_from_a_live_holder_from_a_stale_record():
    def alive(ns, name, uid):
        return True

    def gone(ns, name, uid):
        return False

    assert judge(spec("gpu/gpu-driver-a/uid-a"), record(), now=NOW, live=gone) == "same"
    assert judge(spec("gpu/gpu-driver-a2/uid-b"), record(), now=NOW, live=alive) == "held"
    assert judge(spec("gpu/gpu-driver-a2/uid-b"), record(), now=NOW, live=gone) == "stale"  # gone or Terminating
    late = NOW + datetime.timedelta(seconds=31)
    assert judge(spec("gpu/gpu-driver-a2/uid-b"), record(), now=late, live=alive) == "stale"  # expired
    assert judge({}, record(), now=NOW, live=alive) == "stale"
    # a record written by hand lasts no longer than dra-guard's own
    future = NOW + datetime.timedelta(days=1)
    assert judge(spec("gpu/gpu-driver-a2/uid-b", renewed=future), record(), now=NOW, live=alive) == "stale"
    assert judge(spec("gpu/gpu-driver-a2/uid-b", seconds=86400), record(), now=late, live=alive) == "stale"
    skewed = NOW + datetime.timedelta(seconds=1)  # another replica's clock a second ahead
    assert judge(spec("gpu/gpu-driver-a2/uid-b", renewed=skewed), record(), now=NOW, live=alive) == "held"
    # the same name but another pod object (uid): not a retry of this one
    assert judge(spec("gpu/gpu-driver-a/uid-old"), record(), now=NOW, live=alive) == "held"


def test_record_names_are_dns_labels_one_per_daemonset_and_node():
    long_node = "n" * 253
    names = {
        record_name("gpu", "gpu-driver", "node-a"),
        record_name("gpu", "gpu-driver", "node-b"),
        record_name("gpu", "other", "node-a"),
        record_name("gpu", "gpu-driver", long_node),
    }
    assert len(names) == 4
    assert record_name("gpu", "gpu-driver", "node-a") == record_name("gpu", "gpu-driver", "node-a")
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) and len(n) <= 63 and n.startswith(RECORD_PREFIX) for n in names)


# --------------------------------------------------------------------------- LeaseRecords


class MemoryLeases:
    """The LeaseApi with the apiserver's semantics: create 409 when it exists, replace 409 when the
    resourceVersion differs; `before_replace` runs just before a replace is applied (a racing writer)."""

    def __init__(self):
        self.leases: dict[str, dict] = {}
        self.version = 0
        self.calls: list[str] = []
        self.fail: Exception | None = None
        self.before_replace = None
        self.lock = threading.Lock()

    def _store(self, lease):
        self.version += 1
        stored = json.loads(json.dumps(lease))
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.leases[lease["metadata"]["name"]] = stored
        return json.loads(json.dumps(stored))

    def create(self, lease, *, timeout):
        self.calls.append("create")
        if self.fail:
            raise self.fail
        with self.lock:
            if lease["metadata"]["name"] in self.leases:
                raise Conflict("exists")
            return self._store(lease)

    def get(self, name, *, timeout):
        self.calls.append("get")
        with self.lock:
            found = self.leases.get(name)
            return json.loads(json.dumps(found)) if found else None

    def replace(self, lease, *, timeout):
        self.calls.append("replace")
        if self.before_replace:
            hook, self.before_replace = self.before_replace, None
            hook()
        with self.lock:
            current = self.leases.get(lease["metadata"]["name"])
            if current is None or current["metadata"]["resourceVersion"] != lease["metadata"].get("resourceVersion"):
                raise Conflict("changed")
            return self._store(lease)


def records_of(state, api, now=NOW):
    return LeaseRecords(api, state.claims, namespace="dra-guard", timeout_seconds=2.0, now=lambda: now)


def deadline():
    return time.monotonic() + 2.0


def counted(result):
    return metrics.EVICTION_RECORDS.labels(result=result)._value.get()


def test_two_replicas_asked_about_both_pods_of_a_surge_pair_let_only_one_go():
    api = MemoryLeases()
    one, two = replica(), replica()
    first, second = decide(one, "gpu-driver-a"), decide(two, "gpu-driver-a2")
    assert first.allowed and second.allowed  # each replica alone sees a Ready peer
    before = counted("conflict")
    assert records_of(one, api).own(first.record.lease, deadline())[0] == "created"
    result, why = records_of(two, api).own(second.record.lease, deadline())
    assert result == "conflict" and "gpu/gpu-driver-a/uid-gpu-gpu-driver-a" in why
    assert counted("conflict") == before + 1
    assert not second.settle(result, why).allowed
    assert two.claims.leaving.recent() == frozenset()  # withdrawn: gpu-driver-a2 is no one's leaving pod
    lease = api.leases[first.record.lease.name]
    assert lease["spec"]["holderIdentity"] == "gpu/gpu-driver-a/uid-gpu-gpu-driver-a"
    assert lease["spec"]["leaseDurationSeconds"] == 30
    assert lease["metadata"]["annotations"]["dra-guard.io/peer"] == "gpu/gpu-driver-a2"
    assert lease["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-a-uid"}]
    assert lease["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "dra-guard"


def test_a_retried_eviction_renews_its_own_record():
    api, state = MemoryLeases(), replica()
    lease = decide(state, "gpu-driver-a").record.lease
    assert records_of(state, api).own(lease, deadline())[0] == "created"
    later = NOW + datetime.timedelta(seconds=20)
    assert records_of(replica(), api, now=later).own(lease, deadline())[0] == "renewed"
    assert api.leases[lease.name]["spec"]["renewTime"].startswith("2026-12-01T10:00:20")
    assert api.leases[lease.name]["spec"]["acquireTime"].startswith("2026-12-01T10:00:00")


def test_a_record_whose_holder_is_terminating_or_expired_is_taken_over():
    api = MemoryLeases()
    one = replica()
    assert records_of(one, api).own(decide(one, "gpu-driver-a").record.lease, deadline())[0] == "created"
    # another replica whose cache shows gpu-driver-a Terminating: a new rollout's pod may go
    two = replica()
    two.claims.upsert_pod(ready(pod("gpu-driver-a", "node-a", namespace="gpu", ds="gpu-driver"), terminating=True))
    two.claims.upsert_pod(ready(pod("gpu-driver-a3", "node-a", namespace="gpu", ds="gpu-driver")))
    lease = decide(two, "gpu-driver-a2").record.lease
    assert records_of(two, api).own(lease, deadline())[0] == "taken_over"
    assert api.leases[lease.name]["spec"]["holderIdentity"] == lease.holder
    # and 31 s later, a live holder's record has expired too
    three = replica()
    late = NOW + datetime.timedelta(seconds=31)
    assert records_of(three, api, now=late).own(decide(three, "gpu-driver-a").record.lease, deadline())[0] == "taken_over"


def test_two_takeovers_of_one_stale_record_race_on_the_resource_version_and_one_loses():
    api = MemoryLeases()
    api.leases[record().name] = {"metadata": {"name": record().name, "resourceVersion": "1"}, "spec": spec("gpu/gone-pod/uid-x")}
    api.version = 1
    one, two = replica(), replica()
    a, b = decide(one, "gpu-driver-a").record.lease, decide(two, "gpu-driver-a2").record.lease
    api.before_replace = lambda: records_of(two, api).own(b, deadline())  # b's takeover lands first
    assert records_of(one, api).own(a, deadline())[0] == "conflict"
    assert api.leases[a.name]["spec"]["holderIdentity"] == b.holder


def test_a_peer_that_left_while_the_record_was_read_refuses_and_gives_the_record_up():
    """Replica two allowed gpu-driver-a2 (it holds the record); it is evicted and replica one's cache
    sees it go before replica one reads the record: stale, taken over, but gpu-driver-a's peer is gone."""
    api = MemoryLeases()
    one, two = replica(), replica()
    a = decide(one, "gpu-driver-a").record.lease  # its peer: gpu-driver-a2, Ready in one's cache
    assert records_of(two, api).own(decide(two, "gpu-driver-a2").record.lease, deadline())[0] == "created"
    one.claims.delete_pod("gpu", "gpu-driver-a2")  # evicted; one's watch delivers the deletion
    result, why = records_of(one, api).own(a, deadline())
    assert result == "conflict" and "gpu/gpu-driver-a2" in why
    assert "holderIdentity" not in api.leases[a.name]["spec"]  # given up: nobody waits for its TTL
    assert one.claims.leaving.recent() == frozenset()


def test_an_api_failure_or_no_time_left_is_an_error_never_an_allow_in_enforce_mode():
    api, state = MemoryLeases(), replica()
    lease = decide(state, "gpu-driver-a").record.lease
    api.fail = ClusterError("cannot create leases from https://x: 403 Forbidden")
    result, why = records_of(state, api).own(lease, deadline())
    assert result == "error" and "403 Forbidden" in why
    assert state.claims.leaving.recent() == frozenset()
    api.fail, api.calls = None, []
    result, why = records_of(state, api).own(lease, time.monotonic() + 0.01)
    assert result == "error" and "deadline" in why and api.calls == []  # no call started without time for it


# --------------------------------------------------------------------------- the serve path


def serve(state, mode, outcome):
    calls = []

    def records(lease, deadline):
        calls.append(lease)
        return outcome

    client = create_app(config=state.config, cluster=state, records=records).test_client()

    def evict(name, dry_run=False):
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": eviction_request(name, dry_run=dry_run),
        }
        return client.post("/validate/evictions", json=body).get_json()["response"]

    return evict, calls


def test_the_serve_path_writes_the_record_before_answering_and_refuses_a_conflict_in_enforce_mode():
    refused = metrics.DRIVER_EVICTIONS.labels(driver="gpu.example.com", decision="refused")
    before = refused._value.get()
    evict, calls = serve(replica(), "enforce", ("conflict", "Lease dra-guard/x names gpu/gpu-driver-a2/u as leaving"))
    response = evict("gpu-driver-a")
    assert [c.pod for c in calls] == ["gpu-driver-a"]
    assert response["allowed"] is False and response["status"]["code"] == 429
    assert "allowed to leave a moment ago" in response["status"]["message"]
    assert refused._value.get() == before + 1  # counted as what was answered, after the record


def test_the_serve_path_allows_once_the_record_is_owned_and_a_dry_run_writes_nothing():
    evict, calls = serve(replica(), "enforce", ("created", ""))
    assert evict("gpu-driver-a", dry_run=True)["allowed"] is True and calls == []
    assert evict("gpu-driver-a")["allowed"] is True and len(calls) == 1


@pytest.mark.parametrize("mode", ["warn", "audit"])
def test_in_warn_and_audit_mode_a_record_that_failed_never_blocks(mode):
    state = replica(config=from_mapping({"mode": mode}))
    evict, calls = serve(state, mode, ("error", "Lease dra-guard/x not written: no answer within 2 s"))
    response = evict("gpu-driver-a")
    assert response["allowed"] is True and len(calls) == 1
    assert ("warnings" in response) == (mode == "warn")
