"""The dashboard's eviction guard, probe patches and RBAC rows return series on a real dra-guard's
/metrics: a real `dra-guard serve` on the real control plane refuses a driver eviction (a claim
reserved on the node), then allows it, patches a declared driver's DaemonSet, reports an undeclared
driver without a health port, refuses an RBAC write and reports an RBAC grant a watch event shows.
Its /metrics, with the labels a Prometheus scrape adds, are the input series of `promtool test
rules`, and every query of those rows must return at least one series (as
tests/e2e/test_node_component_metrics.py does for the components' metrics). tests/chart/test_dashboard.py
checks the same queries against webhook/metrics.py; this proves the label values they match on are
the ones dra-guard really writes.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import driver_daemonset, plugin_container
from tests.chart.test_dashboard import dashboard, rows, substitute
from tests.e2e import objects
from tests.e2e.cluster import TOLERATE_ALL, fake_node
from tests.e2e.guard import EVICTION_REFUSED, Guard
from tests.e2e.kube import create_as_aggregation_controller, evict, get_json, wait_for
from tests.scrape import metric, queries_return_series, scrape

NODE = "e2e-dash-node"
DRIVER = "dash.example.com"
WORK, DRIVERS = "dash-work", "dash-gpu"
RBAC = "rbac.authorization.k8s.io"

#: Queries of the three rows that this scenario cannot make return a series, and why. Each is a
#: failure path (stale caches, overload, an internal error, a failed list) or needs the chart's
#: self-managed certificates; tests/chart/test_dashboard.py still checks their metric and labels.
NOT_PRODUCED = {
    (
        "Evictions refused without a verdict: caches not ready or stale, not judged (10m)",
        "A",
    ): "needs caches without news for eviction.maxCacheAgeSeconds",
    (
        "Evictions refused without a verdict: caches not ready or stale, not judged (10m)",
        "B",
    ): "needs an eviction review not judged (limit, overload, deadline)",
    ("Cache freshness: synced caches, failed lists and watches (10m)", "B"): "needs a failed list or watch",
    ("Probe patches skipped, by reason (10m)", "B"): "needs a DaemonSet review not judged",
    ("Probe patches skipped, by reason (10m)", "C"): "needs an internal error of the probes policy",
    (
        "Driver DaemonSets without probes in the cluster (periodic audit)",
        "A",
    ): "the periodic audit's gauge: set only on the replica that ran the audit, after its interval",
    ("Webhook configuration drift and restores", "A"): "needs certificates.mode self with webhooksConfigMap",
    ("Webhook configuration drift and restores", "B"): "needs certificates.mode self with webhooksConfigMap",
}
ROWS = ("Eviction guard", "Probe patches", "RBAC")

DRA_OBJECTS = objects.manifests(
    objects.device_class("e2e-dash-gpu", DRIVER),
    objects.node_slice(NODE, DRIVER),
    objects.namespace(WORK),
    objects.namespace(DRIVERS),
    objects.claim_template(WORK, "e2e-dash-gpu"),
)

CONSUMER = objects.consumer("consumer", WORK, NODE, TOLERATE_ALL)


def on_node(ds: dict) -> dict:
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    return ds


@pytest.fixture(scope="module")
def guard_with_traffic(control_plane, start_guard):
    cp = control_plane
    cp.session("admin").post(f"{cp.url}/api/v1/nodes", json=fake_node(NODE), timeout=10).raise_for_status()
    cp.kubectl("admin", "apply", "-f", "-", input=DRA_OBJECTS)
    g = start_guard(mode="enforce", declared=((DRIVERS, "e2e-dash-driver"),))
    try:
        yield g
    finally:
        g.stop()
        for ns in (WORK, DRIVERS):
            cp.kubectl("admin", "delete", "daemonset,pod", "-n", ns, "--all", "--grace-period=0", "--force", check=False)
        cp.kubectl("admin", "delete", "clusterrolebinding", "e2e-dash-early", "--ignore-not-found", check=False)
        cp.kubectl("admin", "delete", "clusterrole", "e2e-dash-later", "e2e-dash-writer", "--ignore-not-found", check=False)
        # its namespaces are its own (dash-*): nothing waits for them to finish terminating
        cp.kubectl("admin", "delete", "-f", "-", "--wait=false", input=DRA_OBJECTS, check=False)
        cp.kubectl("admin", "delete", "node", NODE, check=False)


def driver_pod(cp) -> str | None:
    pods = get_json(cp, "pods", "-n", DRIVERS, "-l", "app=e2e-dash-driver") or {"items": []}
    running = [p for p in pods["items"] if p["spec"].get("nodeName") == NODE and not p["metadata"].get("deletionTimestamp")]
    return running[0]["metadata"]["name"] if running else None


def claim_reserved(cp) -> list:
    claims = get_json(cp, "resourceclaims", "-n", WORK) or {"items": []}
    return [c for c in claims["items"] if (c.get("status") or {}).get("reservedFor")]


def make_traffic(cp, g: Guard) -> None:
    """Drive every path the rows show: see the module docstring."""
    # probes: the declared driver gets its probe (a patch); the other is a driver without a health
    # port (no-healthcheck-port) that drivers.declared does not list (undeclared)
    declared = on_node(driver_daemonset(name="e2e-dash-driver", namespace=DRIVERS, plugin_subdir=DRIVER))
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(declared))
    portless = on_node(
        driver_daemonset(
            name="e2e-dash-portless",
            namespace=DRIVERS,
            plugin_subdir="portless.example.com",
            containers=[plugin_container("plugin")],
        )
    )
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(portless))
    cp.kubectl("admin", "apply", "-f", "-", input=yaml.safe_dump(CONSUMER))

    # eviction guard: refused while the consumer's claim is reserved, allowed once it is gone
    pod = wait_for("the driver pod on the node", lambda: driver_pod(cp), timeout=90)
    wait_for("the claim reserved", lambda: claim_reserved(cp), timeout=90)

    last: list[object] = []

    def refused():
        r = evict(cp, DRIVERS, pod)
        message = r.json().get("message", "") if r.headers.get("Content-Type", "").startswith("application/json") else ""
        last[:] = [r.status_code, message or r.text]
        return r.status_code == 429 and message.startswith(EVICTION_REFUSED) and "is still needed on node" in message

    try:
        wait_for("dra-guard to refuse the driver's eviction", refused, timeout=60)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; last answer {last}; dra-guard log:\n{g.proc.log() if g.proc else ''}") from None
    assert evict(cp, WORK, "consumer", grace=0).status_code in (200, 201)
    wait_for(
        "the driver's eviction allowed once the claim is released",
        lambda: evict(cp, DRIVERS, pod, grace=0).status_code in (200, 201),
        timeout=60,
    )

    # RBAC: a ClusterRole with DeviceClass write judged (ClusterRoleBindings read first), and a
    # grant made by an identity the webhook never sees, reported by the watch (tests/e2e/test_escalation.py)
    writer = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "e2e-dash-writer"},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["create"]}],
    }
    cp.kubectl("alice", "create", "-f", "-", input=json.dumps(writer), check=False)
    binding = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-dash-early"},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": RBAC}],
        "roleRef": {"kind": "ClusterRole", "name": "e2e-dash-later", "apiGroup": RBAC},
    }
    assert cp.kubectl("alice", "create", "-f", "-", input=json.dumps(binding), check=False).returncode == 0
    later = {**writer, "metadata": {"name": "e2e-dash-later"}}
    create_as_aggregation_controller(cp, later)
    wait_for(
        "the RBAC drift reported",
        lambda: (
            metric(
                scrape(g.proc), "dra_guard_rbac_drift_violations_total", kind="ClusterRoleBinding", action="reported", default=0.0
            )
            > 0
        ),
        timeout=30,
    )
    wait_for(
        "the undeclared driver reported",
        lambda: metric(scrape(g.proc), "dra_guard_undeclared_drivers", daemonset="e2e-dash-portless", default=0.0) == 1,
        timeout=30,
    )


def input_series(text: str) -> list[dict[str, str]]:
    """promtool input series of dra-guard's /metrics `text`, with the job and namespace labels a
    Prometheus scrape of the chart's Service adds: counters (and histogram parts) start from 0, as
    they did when the process started, so increase() and rate() see what it counted; gauges keep
    their value."""
    out = []
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("dra_guard_"):
            continue
        counting = family.type in ("counter", "histogram")
        for s in family.samples:
            if not math.isfinite(s.value) or s.name.endswith("_created"):
                continue
            labels = ",".join(
                f"{k}={json.dumps(v)}" for k, v in sorted({**s.labels, "job": "dra-guard", "namespace": "dra-guard"}.items())
            )
            out.append({"series": f"{s.name}{{{labels}}}", "values": f"{0.0 if counting else s.value!r} {s.value!r}"})
    return out


def row_queries() -> dict[tuple[str, str], str]:
    board = dashboard()
    found = {}
    for title, panels in rows(board).items():
        if title.startswith(ROWS):
            for p in panels:
                for t in p["targets"]:
                    found[(p["title"], t["refId"])] = substitute(t["expr"])
    return found


def test_the_rows_queries_return_series_on_a_real_dra_guards_metrics(control_plane, guard_with_traffic, tmp_path):
    make_traffic(control_plane, guard_with_traffic)
    series = input_series(scrape(guard_with_traffic.proc))
    queries = row_queries()
    assert set(NOT_PRODUCED) <= set(queries), set(NOT_PRODUCED) - set(queries)
    checked = {key: q for key, q in queries.items() if key not in NOT_PRODUCED}
    assert len(checked) >= 12
    out = queries_return_series(checked.values(), series, tmp_path, name="dashboard-metrics-test.yaml")
    assert out.returncode == 0, (
        f"a dashboard query returned no series on dra-guard's real metrics (files in "
        f"{tmp_path}):\n{out.stdout[-6000:]}\n{out.stderr[-2000:]}"
    )
