"""How `dra-guard drain` uses the kubelet's dra_resource_claims_in_use (webhook.kube.nodedrain.Drain):
a consumer that left without the kubelet's word (force-deleted) is confirmed by the gauge when it
can be read, by the safety period only when it cannot be had at all; a moment's failure to read it
(a timeout, a 5xx through the node proxy) confirms nothing and evicts no driver. The API here is a
stand-in for webhook.kube.nodeapi.NodeApi.node_metrics (pure decisions, no timing). A gauge never read in this run is not waited for (a node whose kubelet
is gone would hold every drain of it): any failure then turns to the safety period."""

from __future__ import annotations

import pytest

from webhook.config import from_mapping
from webhook.kube.errors import ClusterError
from webhook.kube.nodeapi import parse_claims_in_use
from webhook.kube.nodedrain import Drain, DrainOptions
from webhook.model import drain
from webhook.model.drain import DriverState

DRIVER = "gpu.example.com"
IN_USE = f'dra_resource_claims_in_use{{driver_name="<any>"}} 1\ndra_resource_claims_in_use{{driver_name="{DRIVER}"}} 1\n'
NONE_IN_USE = 'dra_resource_claims_in_use{driver_name="<any>"} 0\n'


class Metrics:
    """NodeApi.node_metrics answering from a list: text, or a ClusterError to raise."""

    node = "node-a"

    def __init__(self, *answers):
        self.answers, self.asked = list(answers), 0

    def node_metrics(self):
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def make(api, *, safety=90.0):
    said = []
    d = Drain(api, from_mapping(None), DrainOptions(safety_seconds=safety), said.append)
    d.gauge_allowed = True
    return d, said


def test_a_moments_failure_to_read_the_gauge_confirms_nothing_even_after_the_safety_period():
    api = Metrics(IN_USE, ClusterError("get nodes/proxy: 503 Service Unavailable", transient=True), NONE_IN_USE)
    d, said = make(api, safety=10.0)
    since = {DRIVER: 0.0}
    assert "is 1" in d.confirm(since, now=1.0)[DRIVER]
    waiting = d.confirm(since, now=1000.0)  # long after the safety period: still not confirmed
    assert "not readable now" in waiting[DRIVER] and "asking again" in waiting[DRIVER]
    assert d.gauge_allowed
    assert d.confirm(since, now=1001.0) == {} and since == {}
    assert said[-1]["event"] == "confirmed" and said[-1]["message"].endswith(
        "dra_resource_claims_in_use{driver_name=gpu.example.com} is 0"
    )


@pytest.mark.parametrize(
    "failure",
    [
        ClusterError("get nodes/proxy: 400 Bad Request (address not allowed)"),
        ClusterError("get nodes/proxy: 403 Forbidden"),
        "kubelet_running_pods 3\n",  # a kubelet without the gauge
        # never read in this run: a node without addresses, or whose kubelet is gone
        ClusterError("get nodes/proxy: 500 Internal Server Error (no preferred addresses found)", transient=True),
    ],
)
def test_a_gauge_that_cannot_be_had_is_said_once_and_the_safety_period_taken(failure):
    api = Metrics(failure)
    d, said = make(api, safety=10.0)
    since = {DRIVER: 0.0}
    assert "waiting the safety period of 10 s" in d.confirm(since, now=5.0)[DRIVER]
    assert not d.gauge_allowed and api.asked == 1
    assert d.confirm(since, now=11.0) == {} and api.asked == 1
    assert [e["event"] for e in said] == ["warning", "confirmed"]
    assert "waited the safety period of 10 s" in said[-1]["message"]


def test_the_drivers_wait_while_the_gauge_says_in_use_or_cannot_be_read_for_a_moment():
    drivers = [DriverState(name=DRIVER, pods=("dra/driver-x",), available=True, holds=())]
    d, _ = make(Metrics(IN_USE, ClusterError("timed out", transient=True), NONE_IN_USE))
    assert d.in_use(drivers) == (f"the kubelet's dra_resource_claims_in_use{{driver_name={DRIVER}}} is 1",)
    assert "not readable now" in d.in_use(drivers)[0]
    assert d.in_use(drivers) == ()
    d, said = make(Metrics(ClusterError("403 Forbidden")))
    assert d.in_use(drivers) == () and not d.gauge_allowed and said[0]["event"] == "warning"


# ------------------------------------------------------------------ the kubelet's text, parsed
METRICS = """# HELP dra_resource_claims_in_use ...
# TYPE dra_resource_claims_in_use gauge
dra_resource_claims_in_use{driver_name="<any>"} 3
dra_resource_claims_in_use{driver_name="gpu.example.com"} 2
dra_resource_claims_in_use{driver_name="net.example.com"} 0
"""


def test_parse_claims_in_use():
    assert parse_claims_in_use(METRICS) == {"gpu.example.com": 2.0, "net.example.com": 0.0}


#: what the real kubelet v1.37.2 served on the e2e node (GET /api/v1/nodes/NODE/proxy/metrics, as
#: admin) with one claim of the test driver prepared: the gauge with its neighbours, whose
#: driver_name labels must not be read as the gauge's
REAL_KUBELET_ONE_PREPARED = """\
# HELP dra_grpc_operations_duration_seconds [ALPHA] Duration in seconds of the DRA gRPC operations
# TYPE dra_grpc_operations_duration_seconds histogram
dra_grpc_operations_duration_seconds_bucket{driver_name="gpu.e2e.dra-guard.test",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",le="0.1"} 1
dra_grpc_operations_duration_seconds_sum{driver_name="gpu.e2e.dra-guard.test",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 0.005719707
dra_grpc_operations_duration_seconds_count{driver_name="gpu.e2e.dra-guard.test",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 1
# HELP dra_resource_claims_in_use [ALPHA] The number of ResourceClaims that are currently in use on the node, by driver name (driver_name label value) and across all drivers (special value <any> for driver_name). Note that the sum of all by-driver counts is not the total number of in-use ResourceClaims because the same ResourceClaim might use devices from different drivers. Instead, use the count for the <any> driver_name.
# TYPE dra_resource_claims_in_use gauge
dra_resource_claims_in_use{driver_name="<any>"} 1
dra_resource_claims_in_use{driver_name="gpu.e2e.dra-guard.test"} 1
"""


def test_parse_claims_in_use_reads_the_real_kubelets_exposition():
    assert parse_claims_in_use(REAL_KUBELET_ONE_PREPARED) == {"gpu.e2e.dra-guard.test": 1.0}
    # once unprepared the kubelet leaves the driver out and keeps the total (pkg/kubelet/cm/dra claimsInUse)
    after = REAL_KUBELET_ONE_PREPARED.replace('"<any>"} 1', '"<any>"} 0').replace(
        'dra_resource_claims_in_use{driver_name="gpu.e2e.dra-guard.test"} 1\n', ""
    )
    assert parse_claims_in_use(after) == {}
    ok, how = drain.confirm(
        "gpu.e2e.dra-guard.test", since=0.0, now=0.0, gauge=parse_claims_in_use(after), gauge_error="", safety_seconds=90
    )
    assert ok and "is 0" in how


@pytest.mark.parametrize(
    "text",
    [
        "",  # an empty answer
        "# HELP kubelet_running_pods [ALPHA] Number of pods\nkubelet_running_pods 3\n",  # a kubelet without the gauge
        REAL_KUBELET_ONE_PREPARED.replace('dra_resource_claims_in_use{driver_name="<any>"} 1\n', ""),  # no total
    ],
)
def test_a_metrics_text_without_the_gauges_total_is_not_read_as_nothing_prepared(text):
    """A kubelet older than v1.34 (or with the metric disabled) never says a claim is prepared:
    its silence is no proof that a force-deleted consumer's claims were unprepared."""
    with pytest.raises(ValueError, match="dra_resource_claims_in_use"):
        parse_claims_in_use(text)


def test_a_text_that_is_no_exposition_is_an_error_not_a_reading():
    """prometheus_client's parser refuses what the hand-rolled line matching read as samples."""
    with pytest.raises(ValueError):
        parse_claims_in_use('dra_resource_claims_in_use{driver_name="<any>" 1\ndra_resource_claims_in_use{driver_name="gpu"} 1\n')


class Access:
    """NodeApi.can_i answering from `allowed`: (verb, resource, subresource, namespace) tuples."""

    node = "node-a"

    def __init__(self, allowed):
        self.allowed = allowed

    def can_i(self, verb, resource, group="", subresource="", name="", namespace=""):
        return (verb, resource, subresource, namespace) in self.allowed


def test_events_are_asked_for_in_the_namespace_they_are_written_to():
    """A drain user allowed Events only in `default` (where NodeApi.event writes them) gets them."""
    from webhook.kube.nodeapi import EVENTS_NAMESPACE
    from webhook.kube.nodedrain import REQUIRED

    allowed = {(verb, resource, sub, "") for verb, resource, _group, sub, _why in REQUIRED}
    d = Drain(Access(allowed | {("create", "events", "", EVENTS_NAMESPACE)}), from_mapping(None), DrainOptions(), [].append)
    d.preflight()
    assert d.events_allowed and not d.gauge_allowed
    d = Drain(Access(allowed), from_mapping(None), DrainOptions(), [].append)
    d.preflight()
    assert not d.events_allowed
