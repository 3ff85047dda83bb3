"""The RBAC guard through a real kube-apiserver, driven by the real kubectl (issue scenarios 1-6)."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.kube import OWN_CLOCK_RESOURCES
from tests.scrape import metric, scrape


@pytest.fixture
def enforce(guard):
    if guard.mode != "enforce" or guard.proc is None:
        guard.start(mode="enforce")
        guard.wait_called()
    return guard


def role_yaml(name, resources, verbs, labels=None):
    doc = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": resources, "verbs": verbs}],
    }
    if labels:
        doc["metadata"]["labels"] = labels
    return json.dumps(doc)


def binding_yaml(name, role, group, annotations=None):
    meta = {"name": name, **({"annotations": annotations} if annotations else {})}
    return json.dumps(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "subjects": [{"kind": "Group", "name": group, "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "ClusterRole", "name": role, "apiGroup": "rbac.authorization.k8s.io"},
        }
    )


def exists(cp, kind, name):
    return cp.kubectl("admin", "get", kind, name, "--ignore-not-found", "-o", "name").stdout.strip() != ""


def apply(cp, user, doc, *args):
    return cp.kubectl(user, "apply", *args, "-f", "-", input=doc, check=False)


# ---------------------------------------------------------------- scenarios 1 and 2
def test_binding_with_slice_write_is_refused_and_not_stored(control_plane, enforce):
    cp = control_plane
    assert apply(cp, "admin", role_yaml("e2e-slice-writer", ["resourceslices"], ["create", "patch"])).returncode == 0
    out = apply(cp, "alice", binding_yaml("e2e-team-a-slices", "e2e-slice-writer", "team-a"))
    assert out.returncode != 0
    assert "dra-guard" in out.stderr and "Group team-a" in out.stderr and "resourceslices" in out.stderr
    assert not exists(cp, "clusterrolebinding", "e2e-team-a-slices")


def test_a_namespace_written_on_the_cluster_role_binding_does_not_make_it_a_role_binding(control_plane, enforce):
    """kubectl sends the manifest as written; the apiserver stores a ClusterRoleBinding without the
    namespace (cluster-wide) whatever the manifest says, and clears it before it calls validating
    webhooks, so the live review is judged cluster-wide and refused like any other (`dra-guard
    audit -f` drops it when it reads the file: webhook.audit.load)."""
    cp = control_plane
    assert apply(cp, "admin", role_yaml("e2e-stray-writer", ["deviceclasses"], ["create"])).returncode == 0
    doc = json.loads(binding_yaml("e2e-stray-ns", "e2e-stray-writer", "team-a"))
    doc["metadata"]["namespace"] = "default"
    out = cp.kubectl("alice", "create", "-f", "-", input=json.dumps(doc), check=False)
    assert out.returncode != 0 and "denied the request" in out.stderr, out.stderr
    assert not exists(cp, "clusterrolebinding", "e2e-stray-ns")


def test_server_side_dry_run_gets_the_same_refusal(control_plane, enforce):
    cp = control_plane
    apply(cp, "admin", role_yaml("e2e-slice-writer", ["resourceslices"], ["create", "patch"]))
    real = apply(cp, "alice", binding_yaml("e2e-dry", "e2e-slice-writer", "team-a"))
    dry = apply(cp, "alice", binding_yaml("e2e-dry", "e2e-slice-writer", "team-a"), "--dry-run=server")
    assert dry.returncode != 0 and real.returncode != 0
    assert "Group team-a" in dry.stderr
    assert dry.stderr.split("denied the request:")[-1] == real.stderr.split("denied the request:")[-1]


def test_warn_mode_prints_warning_and_stores(control_plane, guard):
    cp = control_plane
    guard.start(mode="warn")
    guard.wait_called()
    apply(cp, "admin", role_yaml("e2e-slice-writer", ["resourceslices"], ["create", "patch"]))
    out = apply(cp, "alice", binding_yaml("e2e-warned", "e2e-slice-writer", "team-a"))
    assert out.returncode == 0, out.stderr
    assert "Warning:" in out.stderr and "team-a" in out.stderr
    assert exists(cp, "clusterrolebinding", "e2e-warned")
    cp.kubectl("admin", "delete", "clusterrolebinding", "e2e-warned")


def test_audit_mode_stores_silently_and_counts_the_finding(control_plane, guard):
    cp = control_plane
    guard.start(mode="audit")
    guard.wait_called()
    before = metric(scrape(guard.proc), "dra_guard_admission_violations_total", policy="rbac", mode="audit", default=0.0)
    apply(cp, "admin", role_yaml("e2e-slice-writer", ["resourceslices"], ["create", "patch"]))
    out = apply(cp, "alice", binding_yaml("e2e-audited", "e2e-slice-writer", "team-a"))
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr
    assert exists(cp, "clusterrolebinding", "e2e-audited")
    assert (
        metric(scrape(guard.proc), "dra_guard_admission_violations_total", policy="rbac", mode="audit", default=0.0) == before + 1
    )
    cp.kubectl("admin", "delete", "clusterrolebinding", "e2e-audited")


# ---------------------------------------------------------------- scenarios 3 and 4
def test_member_role_aggregated_into_bound_edit_is_refused(control_plane, enforce):
    cp = control_plane
    # `edit` everywhere is itself refused now (pods, secrets and ServiceAccount
    # impersonation in kube-system); the admin stores it with the break-glass annotation
    glass = {"dra-guard.io/allow-dra-write": "e2e: edit for devs, accepted"}
    out = apply(cp, "admin", binding_yaml("e2e-devs-edit", "edit", "devs", annotations=glass))
    assert out.returncode == 0, out.stderr
    try:
        out = apply(
            cp,
            "alice",
            role_yaml(
                "e2e-edit-slices", ["resourceslices"], ["patch"], labels={"rbac.authorization.k8s.io/aggregate-to-edit": "true"}
            ),
        )
        assert out.returncode != 0
        assert "Group devs" in out.stderr and "e2e-devs-edit" in out.stderr
        assert not exists(cp, "clusterrole", "e2e-edit-slices")
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding", "e2e-devs-edit")


def test_role_created_after_its_binding_is_refused(control_plane, enforce):
    cp = control_plane
    first = apply(cp, "alice", binding_yaml("e2e-early", "e2e-later", "team-a"))
    assert first.returncode == 0 and "does not exist yet" in first.stderr
    # at once: a binding the watch has not delivered yet is read from the API before judging the role
    second = apply(cp, "alice", role_yaml("e2e-later", ["deviceclasses"], ["create"]))
    assert second.returncode != 0
    assert "e2e-early" in second.stderr and "deviceclasses" in second.stderr
    cp.kubectl("admin", "delete", "clusterrolebinding", "e2e-early")


def test_binding_and_role_in_one_apply_cannot_slip_through(control_plane, enforce):
    """kubectl applies a List in order, milliseconds apart: binding first, then its role. (On this
    local apiserver the watch is usually faster than kubectl, so the race is rarely hit here; the
    unit test test_role_with_protected_grants_reads_bindings_the_watch_has_not_delivered pins it.)"""
    cp = control_plane
    both = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                json.loads(binding_yaml("e2e-race", "e2e-race-role", "team-a")),
                json.loads(role_yaml("e2e-race-role", ["resourceslices"], ["update"])),
            ],
        }
    )
    try:
        out = apply(cp, "alice", both)
        assert out.returncode != 0 and "e2e-race" in out.stderr
        assert not exists(cp, "clusterrole", "e2e-race-role")
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding", "e2e-race", "--ignore-not-found")
        cp.kubectl("admin", "delete", "clusterrole", "e2e-race-role", "--ignore-not-found")


# ---------------------------------------------------------------- scenario 5
def test_fail_policy_with_dra_guard_down_and_break_glass(control_plane, guard):
    cp = control_plane
    guard.stop_server()
    try:
        out = apply(cp, "alice", binding_yaml("e2e-while-down", "view", "team-a"))
        assert out.returncode != 0
        assert "failed calling webhook" in out.stderr and "rbac.dra-guard.io" in out.stderr
        guard.unregister()  # break-glass: delete the configuration
        out = apply(cp, "alice", binding_yaml("e2e-while-down", "view", "team-a"))
        assert out.returncode == 0, out.stderr
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding", "e2e-while-down", "--ignore-not-found")
        guard.start(mode="enforce")
        guard.register()


# ---------------------------------------------------------------- scenario 6
def _guard_requests(cp, since_ids):
    """dra-guard's requests (one entry per auditID, any stage) not among `since_ids`."""
    seen = {}
    for ev in cp.audit_events("dra-guard", stage=None):
        if ev["auditID"] not in since_ids:
            seen.setdefault(ev["auditID"], ev)
    return list(seen.values())


def test_no_api_requests_per_review(control_plane, enforce):
    """200 kubectl creates through the apiserver and 10,000 direct reviews over TLS: dra-guard
    makes no Kubernetes API request (its lists and watches were made before)."""
    cp = control_plane
    before_ids = {ev["auditID"] for ev in cp.audit_events("dra-guard", stage=None)}
    assert before_ids, "the audit log shows none of dra-guard's initial lists and watches"
    api_before = sum(
        metric(scrape(enforce.proc), "dra_guard_kube_api_requests_total", verb=v, resource=r, default=0.0)
        for v in ("list", "watch")
        for r in ("clusterroles", "clusterrolebindings")
    )
    items = [json.loads(binding_yaml(f"e2e-harmless-{i}", "view", f"team-{i}")) for i in range(200)]
    for item in items:
        item["metadata"]["labels"] = {"e2e": "harmless"}
    out = cp.kubectl("alice", "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    assert out.stdout.count("created") == 200

    from tests.builders import binding, review, subject

    session = enforce.proc.session()
    body = review(binding("direct", "e2e-slice-writer", [subject("Group", "team-a")]))
    for i in range(10_000):
        body["request"]["uid"] = f"uid-{i}"
        resp = session.post(enforce.url + "/validate/rbac", json=body)
        assert resp.status_code == 200
    assert resp.json()["response"]["allowed"] is False

    time.sleep(1.5)  # let the audit backend flush
    calls = [
        (e["verb"], e.get("objectRef", {}).get("resource"))
        for e in _guard_requests(cp, before_ids)
        if e.get("objectRef", {}).get("resource") not in OWN_CLOCK_RESOURCES
    ]
    assert all(verb == "watch" for verb, _ in calls), calls  # at most a watch renewal, never a get/list per review
    api_after = sum(
        metric(scrape(enforce.proc), "dra_guard_kube_api_requests_total", verb=v, resource=r, default=0.0)
        for v in ("list", "watch")
        for r in ("clusterroles", "clusterrolebindings")
    )
    assert api_after - api_before <= len(calls)
    cp.kubectl("admin", "delete", "clusterrolebinding", "-l", "e2e=harmless", "--wait=false")


def test_cache_sync_time_is_a_metric_and_a_log_line(control_plane, enforce):
    """Each cache's start-up LIST time is exported (dra_guard_cache_list_seconds) and logged with
    its object count, so an admin can see how long a restart takes to become ready."""
    caches = ("clusterroles", "clusterrolebindings", "daemonsets", "pods", "resourceclaims", "resourceslices")
    for cache in caches:
        assert 0 < metric(scrape(enforce.proc), "dra_guard_cache_list_seconds", cache=cache, default=0.0) < 30, cache
    synced = [
        json.loads(line)
        for line in enforce.proc.log_file.read_text(errors="replace").splitlines()
        if line.startswith("{") and '"cache synced"' in line
    ]
    by_cache = {entry["cache"]: entry for entry in synced}
    assert set(caches) <= set(by_cache)
    assert by_cache["clusterroles"]["objects"] > 50  # the bootstrap roles at least
    assert by_cache["clusterroles"]["seconds"] >= 0


def test_cache_sizes_are_exported_and_follow_the_cluster(control_plane, enforce):
    """dra_guard_cache_objects{cache} says how many objects each cache holds, so
    operators can alert before the memory limit; it equals what the apiserver lists and follows a
    create within the watch's delay."""
    cp = control_plane
    listed = len(json.loads(cp.kubectl("admin", "get", "clusterroles", "-o", "json").stdout)["items"])
    deadline = time.monotonic() + 10
    while (
        metric(scrape(enforce.proc), "dra_guard_cache_objects", cache="clusterroles", default=0.0) != listed
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert metric(scrape(enforce.proc), "dra_guard_cache_objects", cache="clusterroles", default=0.0) == listed
    assert apply(cp, "admin", role_yaml("e2e-size-probe", ["resourceclaims"], ["get"])).returncode == 0
    try:
        deadline = time.monotonic() + 10
        while (
            metric(scrape(enforce.proc), "dra_guard_cache_objects", cache="clusterroles", default=0.0) != listed + 1
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert metric(scrape(enforce.proc), "dra_guard_cache_objects", cache="clusterroles", default=0.0) == listed + 1
    finally:
        cp.kubectl("admin", "delete", "clusterrole", "e2e-size-probe", "--ignore-not-found")
    for cache in ("clusterrolebindings", "roles", "rolebindings", "daemonsets", "pods", "resourceclaims", "resourceslices"):
        text = enforce.proc.session().get(enforce.url + "/metrics").text
        assert f'dra_guard_cache_objects{{cache="{cache}"}}' in text, cache
