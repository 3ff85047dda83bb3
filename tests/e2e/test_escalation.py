"""Every path to DRA write a non-admin RBAC manager had, on the real control plane.

alice (tests/e2e/manifests/rbac-managers.yaml) holds bind/escalate and write on roles and bindings,
nothing else. Each test tries one path of the issue as alice and expects dra-guard's refusal (the
object is not stored), then shows that the same write by an admin (break-glass, or a subject in
rbac.adminSubjects) or a real driver's install still passes. Path 9 (races, writers the webhook
never sees): concurrent writes are never both stored, and an unseen writer's role is reported
within 30 s.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.guard import NAMESPACE
from tests.e2e.kube import apply_objects, create_as_aggregation_controller
from tests.scrape import metric, scrape

RBAC = "rbac.authorization.k8s.io"
DENIED = 'admission webhook "rbac.dra-guard.io" denied the request'
BREAK_GLASS = {"dra-guard.io/allow-dra-write": "e2e: accepted by an admin"}


def role(name, rules, *, namespace=None, annotations=None):
    meta = {
        "name": name,
        **({"namespace": namespace} if namespace else {}),
        **({"annotations": annotations} if annotations else {}),
    }
    return {"apiVersion": f"{RBAC}/v1", "kind": "Role" if namespace else "ClusterRole", "metadata": meta, "rules": rules}


def bind(name, role_name, subjects, *, namespace=None, role_kind="ClusterRole", annotations=None):
    meta = {
        "name": name,
        **({"namespace": namespace} if namespace else {}),
        **({"annotations": annotations} if annotations else {}),
    }
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": meta,
        "subjects": subjects,
        "roleRef": {"kind": role_kind, "name": role_name, "apiGroup": RBAC},
    }


ALICE = [{"kind": "User", "name": "alice", "apiGroup": RBAC}]


def create(cp, user, doc):
    return cp.kubectl(user, "create", "-f", "-", input=json.dumps(doc), check=False)


def exists(cp, kind, name, namespace=None):
    ns = ["-n", namespace] if namespace else []
    return cp.kubectl("admin", "get", kind, name, *ns, "--ignore-not-found", "-o", "name").stdout.strip() != ""


def delete(cp, kind, name, namespace=None):
    ns = ["-n", namespace] if namespace else []
    cp.kubectl("admin", "delete", kind, name, *ns, "--ignore-not-found", "--wait=false")


def refused(out, *words):
    assert out.returncode != 0, out.stdout
    assert DENIED in out.stderr, out.stderr
    for w in words:
        assert w in out.stderr, (w, out.stderr)


@pytest.fixture(scope="module")
def guard(control_plane, start_guard):
    """dra-guard in enforce mode (driver subject dra-system:driver), registered with the chart's
    configurations; active once a probe binding is really refused by it (not only answered)."""
    cp = control_plane
    g = start_guard(namespaces=(NAMESPACE, "dra-system", "team-a"), mode="enforce")
    probe = bind("e2e-esc-probe", "cluster-admin", [{"kind": "Group", "name": "e2e-probe", "apiGroup": RBAC}])
    deadline = time.monotonic() + 30
    while True:
        out = cp.kubectl("alice", "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False)
        if out.returncode != 0 and DENIED in out.stderr:
            break
        assert time.monotonic() < deadline, f"dra-guard never refused the probe: {out.stderr}"
        time.sleep(0.3)
    try:
        yield g
    finally:
        g.stop()


# ------------------------------------------------------------------ path 1: impersonation
def test_path1_impersonating_admins_is_refused(control_plane, guard):
    cp = control_plane
    imp = role(
        "e2e-esc-impersonate-masters",
        [{"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": ["system:masters"]}],
    )
    try:
        assert create(cp, "alice", imp).returncode == 0  # a role alone grants nothing
        out = create(cp, "alice", bind("e2e-esc-imp", imp["metadata"]["name"], ALICE))
        refused(out, "User alice", "impersonate:groups")
        assert not exists(cp, "clusterrolebinding", "e2e-esc-imp")
        assert (
            cp.kubectl(
                "alice",
                "auth",
                "can-i",
                "create",
                "deviceclasses.resource.k8s.io",
                "--as=alice",
                "--as-group=system:masters",
                check=False,
            ).returncode
            != 0
        )
        # control: impersonating a group that holds no DRA write is no power
        harmless = role(
            "e2e-esc-impersonate-team",
            [{"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": ["team-b"]}],
        )
        assert create(cp, "alice", harmless).returncode == 0
        out = create(cp, "alice", bind("e2e-esc-imp-team", harmless["metadata"]["name"], ALICE))
        assert out.returncode == 0, out.stderr
        # the admin's write passes (break-glass, honoured for admins only)
        out = create(cp, "admin", bind("e2e-esc-imp-admin", imp["metadata"]["name"], ALICE, annotations=BREAK_GLASS))
        assert out.returncode == 0, out.stderr
        out = create(cp, "alice", bind("e2e-esc-imp-glass", imp["metadata"]["name"], ALICE, annotations=BREAK_GLASS))
        refused(out, "honoured only when a cluster admin")
    finally:
        for b in ("e2e-esc-imp", "e2e-esc-imp-team", "e2e-esc-imp-admin", "e2e-esc-imp-glass"):
            delete(cp, "clusterrolebinding", b)
        for r in ("e2e-esc-impersonate-masters", "e2e-esc-impersonate-team"):
            delete(cp, "clusterrole", r)


# ------------------------------------------------------------------ paths 2, 3, 4: sensitive namespaces
@pytest.mark.parametrize(
    "namespace", ["kube-system", "dra-system", NAMESPACE], ids=["path2-kube-system", "path3-driver-ns", "path4-dra-guard-ns"]
)
def test_edit_in_a_sensitive_namespace_is_refused(control_plane, guard, namespace):
    cp = control_plane
    name = "e2e-esc-edit"
    try:
        out = create(cp, "alice", bind(name, "edit", ALICE, namespace=namespace))
        if namespace == NAMESPACE:
            refused(out, f"RoleBinding {namespace}/{name}", "belongs to dra-guard")
        else:
            refused(out, f"RoleBinding {namespace}/{name}", "User alice")
        assert not exists(cp, "rolebinding", name, namespace)
        # control: the same RoleBinding in an ordinary namespace is allowed
        out = create(cp, "alice", bind(name, "edit", ALICE, namespace="team-a"))
        assert out.returncode == 0, out.stderr
        # control: `view` in the sensitive namespace holds no power
        out = create(cp, "alice", bind("e2e-esc-view", "view", ALICE, namespace=namespace))
        if namespace == NAMESPACE:
            refused(out, "belongs to dra-guard")  # dra-guard's namespace: admins only, whatever the role
        else:
            assert out.returncode == 0, out.stderr
        # the admin's write passes (break-glass)
        out = create(cp, "admin", bind(name, "edit", ALICE, namespace=namespace, annotations=BREAK_GLASS))
        assert out.returncode == 0, out.stderr
    finally:
        for ns in (namespace, "team-a"):
            delete(cp, "rolebinding", name, ns)
            delete(cp, "rolebinding", "e2e-esc-view", ns)


def test_path2_token_minting_role_in_kube_system_is_refused(control_plane, guard):
    cp = control_plane
    tokens = role(
        "e2e-esc-tokens",
        [{"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}],
        namespace="kube-system",
    )
    try:
        assert create(cp, "admin", tokens).returncode == 0
        out = create(cp, "alice", bind("e2e-esc-tokens", "e2e-esc-tokens", ALICE, namespace="kube-system", role_kind="Role"))
        refused(out, "serviceaccounts/token")
    finally:
        delete(cp, "rolebinding", "e2e-esc-tokens", "kube-system")
        delete(cp, "role", "e2e-esc-tokens", "kube-system")


def test_path4_dra_guards_own_roles_are_changed_by_admins_only(control_plane, guard):
    cp = control_plane
    mine = role(
        "e2e-esc-own", [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}], namespace=NAMESPACE
    )
    try:
        refused(create(cp, "alice", mine), "belongs to dra-guard")
        assert create(cp, "admin", mine).returncode == 0
    finally:
        delete(cp, "role", "e2e-esc-own", NAMESPACE)


def test_path3_a_real_driver_install_still_passes(control_plane, guard):
    """The driver's RBAC shaped like the NVIDIA and dra-example-driver charts: ResourceSlice write and
    a controller that manages DaemonSets and Pods, for ServiceAccount dra-system:driver (a driver
    subject), installed by the admin."""
    cp = control_plane
    objs = [
        role(
            "e2e-esc-driver",
            [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceslices"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                },
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceclaims", "deviceclasses"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["apps"],
                    "resources": ["daemonsets"],
                    "verbs": ["get", "list", "watch", "create", "update", "delete"],
                },
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
            ],
        ),
        bind("e2e-esc-driver", "e2e-esc-driver", [{"kind": "ServiceAccount", "name": "driver", "namespace": "dra-system"}]),
        role(
            "e2e-esc-driver-secrets",
            [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]}],
            namespace="dra-system",
        ),
        bind(
            "e2e-esc-driver-secrets",
            "e2e-esc-driver-secrets",
            [{"kind": "ServiceAccount", "name": "driver", "namespace": "dra-system"}],
            namespace="dra-system",
            role_kind="Role",
        ),
    ]
    try:
        for o in objs:
            out = create(cp, "admin", o)
            assert out.returncode == 0, out.stderr
    finally:
        delete(cp, "clusterrolebinding", "e2e-esc-driver")
        delete(cp, "clusterrole", "e2e-esc-driver")
        delete(cp, "rolebinding", "e2e-esc-driver-secrets", "dra-system")
        delete(cp, "role", "e2e-esc-driver-secrets", "dra-system")


# ------------------------------------------------------------------ path 5: admission configuration
def test_path5_webhook_configuration_write_is_refused(control_plane, guard):
    cp = control_plane
    vwc = role(
        "e2e-esc-vwc",
        [
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["validatingwebhookconfigurations"],
                "verbs": ["get", "update", "patch"],
            }
        ],
    )
    try:
        assert create(cp, "alice", vwc).returncode == 0
        refused(create(cp, "alice", bind("e2e-esc-vwc", "e2e-esc-vwc", ALICE)), "validatingwebhookconfigurations")
        assert not exists(cp, "clusterrolebinding", "e2e-esc-vwc")
    finally:
        delete(cp, "clusterrolebinding", "e2e-esc-vwc")
        delete(cp, "clusterrole", "e2e-esc-vwc")


# ------------------------------------------------------------------ path 6: dra-guard's own RBAC
def test_path6_dra_guards_cluster_role_cannot_be_stripped(control_plane, guard):
    cp = control_plane
    name = json.loads(cp.kubectl("admin", "get", "clusterrolebinding", "-o", "json").stdout)
    own = next(
        b["roleRef"]["name"]
        for b in name["items"]
        if any(s.get("name") == "dra-guard" and s.get("kind") == "User" for s in b.get("subjects") or [])
    )
    before = json.loads(cp.kubectl("admin", "get", "clusterrole", own, "-o", "json").stdout)
    stripped = dict(before, rules=before["rules"][1:])
    out = cp.kubectl("alice", "replace", "-f", "-", input=json.dumps(stripped), check=False)
    refused(out, "belongs to dra-guard")
    after = json.loads(cp.kubectl("admin", "get", "clusterrole", own, "-o", "json").stdout)
    assert after["rules"] == before["rules"]
    # control: a role with write on it by name is a power; granting it to alice is refused
    rw = role(
        "e2e-esc-own-writer", [{"apiGroups": [RBAC], "resources": ["clusterroles"], "verbs": ["update"], "resourceNames": [own]}]
    )
    try:
        assert create(cp, "alice", rw).returncode == 0
        refused(create(cp, "alice", bind("e2e-esc-own-writer", "e2e-esc-own-writer", ALICE)), "clusterroles:dra-guard")
    finally:
        delete(cp, "clusterrolebinding", "e2e-esc-own-writer")
        delete(cp, "clusterrole", "e2e-esc-own-writer")


# ------------------------------------------------------------------ path 7: bootstrap roles
def test_path7_stripped_cluster_admin_is_judged_by_its_default_rules(control_plane, guard):
    cp = control_plane
    original = json.loads(cp.kubectl("admin", "get", "clusterrole", "cluster-admin", "-o", "json").stdout)
    assert original["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"] == "true"
    try:
        stripped = dict(original, rules=[{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}])
        out = cp.kubectl("alice", "replace", "-f", "-", input=json.dumps(stripped), check=False)
        assert out.returncode == 0, out.stderr  # removing rules gives nobody anything
        out = create(cp, "alice", bind("e2e-esc-stripped", "cluster-admin", ALICE))
        refused(out, "deviceclasses")
        assert not exists(cp, "clusterrolebinding", "e2e-esc-stripped")
    finally:
        delete(cp, "clusterrolebinding", "e2e-esc-stripped")
        restore = {k: v for k, v in original.items() if k != "metadata"}
        restore["metadata"] = {
            "name": "cluster-admin",
            "annotations": original["metadata"]["annotations"],
            "labels": original["metadata"].get("labels", {}),
        }
        apply_objects(cp, restore)


# ------------------------------------------------------------------ path 8: DeviceTaintRules
def test_path8_device_taint_rule_write_is_refused(control_plane, guard):
    cp = control_plane
    taints = role(
        "e2e-esc-taints", [{"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"], "verbs": ["create", "update"]}]
    )
    try:
        assert create(cp, "alice", taints).returncode == 0
        refused(create(cp, "alice", bind("e2e-esc-taints", "e2e-esc-taints", ALICE)), "devicetaintrules")
        out = create(cp, "admin", bind("e2e-esc-taints", "e2e-esc-taints", ALICE, annotations=BREAK_GLASS))
        assert out.returncode == 0, out.stderr
    finally:
        delete(cp, "clusterrolebinding", "e2e-esc-taints")
        delete(cp, "clusterrole", "e2e-esc-taints")


# ------------------------------------------------------------------ path 9: what admission cannot see
def drift_reported(guard, kind):
    return metric(scrape(guard.proc), "dra_guard_rbac_drift_violations_total", action="reported", kind=kind, default=0.0)


def test_path9_role_created_by_an_unseen_writer_is_reported_within_30s(control_plane, guard):
    """A binding to a role that does not exist yet (allowed, with a warning), then the role with
    DeviceClass write created by an identity the webhook never sees (the aggregation controller,
    left out by matchConditions): the watch event is re-judged and reported (metric, Event)."""
    cp = control_plane
    before = drift_reported(guard, "ClusterRoleBinding")
    writer = role("e2e-esc-later", [{"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["create"]}])
    try:
        out = create(cp, "alice", bind("e2e-esc-early", "e2e-esc-later", ALICE))
        assert out.returncode == 0 and "does not exist yet" in out.stderr, out.stderr
        create_as_aggregation_controller(cp, writer)
        started = time.monotonic()
        events = ""
        while time.monotonic() - started < 30:
            events = cp.kubectl(
                "admin",
                "get",
                "events",
                "-n",
                "default",
                "--field-selector",
                "involvedObject.name=e2e-esc-early,reason=RbacViolation",
                "-o",
                "json",
            ).stdout
            if drift_reported(guard, "ClusterRoleBinding") > before and json.loads(events)["items"]:
                break
            time.sleep(0.5)
        assert drift_reported(guard, "ClusterRoleBinding") > before, "no drift reported within 30 s"
        items = json.loads(events)["items"]
        assert items and "User alice" in items[0]["message"] and "deviceclasses" in items[0]["message"]
        assert items[0]["involvedObject"]["kind"] == "ClusterRoleBinding" and items[0]["type"] == "Warning"
        assert exists(cp, "clusterrolebinding", "e2e-esc-early")  # remediation is off by default
    finally:
        delete(cp, "clusterrolebinding", "e2e-esc-early")
        delete(cp, "clusterrole", "e2e-esc-later")


def test_path9_concurrent_role_update_and_binding_are_never_both_stored(control_plane, guard):
    """The race of the issue: a role UPDATE adding DeviceClass write and a binding of that role, sent
    by alice at the same moment (both were stored about one try in five). One replica judges them
    against each other's pending decisions: at most one is stored, in every try."""
    import threading

    cp = control_plane
    base = f"{cp.url}/apis/{RBAC}/v1"
    session = cp.session("alice")
    both = []
    for i in range(10):
        name = f"e2e-esc-race-{i}"
        create(
            cp, "admin", role(name, [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["create"]}])
        )
        barrier = threading.Barrier(2)
        codes = {}

        def update(name=name, barrier=barrier, codes=codes):
            barrier.wait()
            codes["role"] = session.patch(
                f"{base}/clusterroles/{name}",
                headers={"Content-Type": "application/merge-patch+json"},
                json={"rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["create"]}]},
                timeout=15,
            ).status_code

        def bind_it(name=name, barrier=barrier, codes=codes):
            barrier.wait()
            codes["binding"] = session.post(f"{base}/clusterrolebindings", json=bind(name, name, ALICE), timeout=15).status_code

        threads = [threading.Thread(target=update), threading.Thread(target=bind_it)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            assert set(codes.values()) <= {200, 201, 403}, codes
            if codes["role"] == 200 and codes["binding"] == 201:
                both.append(i)
        finally:
            delete(cp, "clusterrolebinding", name)
            delete(cp, "clusterrole", name)
    assert not both, f"role update and binding both stored in tries {both}"
