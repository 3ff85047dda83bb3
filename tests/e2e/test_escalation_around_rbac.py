"""Escalation: the API around RBAC, node identities and DRA's own admin access, on a
control plane configured like kubeadm's (Node authorizer, NodeRestriction, client CA, the
controller manager signing CSRs with per-controller ServiceAccounts).

alice and bob manage RBAC (tests/e2e/manifests/rbac-managers.yaml) and are not admins. Each power
is first shown to be a real path where that is cheap to show here (a kubelet client certificate
from a CSR writes ResourceSlices for "its" node), then alice's grant of it is refused; an admin's
grant of it (never sent to dra-guard) is reported by `dra-guard audit --cluster`.

At the end: forged reviews POSTed straight to the webhook port never widen what
dra-guard allows; the admin-access label through the Namespace subresources; token minting where
an excepted ServiceAccount lives. dra-guard runs with the documented vendor exception.
"""

from __future__ import annotations

import base64
import datetime
import json
import time

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.e2e.guard import NAMESPACE, Guard
from tests.e2e.kube import audit_findings, wait_for

RBAC = "rbac.authorization.k8s.io"
DENIED = 'admission webhook "rbac.dra-guard.io" denied the request'
NS_DENIED = 'admission webhook "namespaces.dra-guard.io" denied the request'
ALICE = [{"kind": "User", "name": "alice", "apiGroup": RBAC}]
LABEL = "resource.kubernetes.io/admin-access"


def cluster_role(name, rules):
    return {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules}


def bind(name, role, subjects, *, namespace=None):
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": meta,
        "subjects": subjects,
        "roleRef": {"kind": "ClusterRole", "name": role, "apiGroup": RBAC},
    }


def create(cp, user, doc):
    return cp.kubectl(user, "create", "-f", "-", input=json.dumps(doc), check=False)


#: the documented exception (docs/policies/exceptions.md): a vendor's ServiceAccount may write ResourceSlices
VENDOR_EXCEPTION = f"""exceptions:
  - policy: rbac
    kind: ClusterRoleBinding
    name: e2e-r3-inventory
    roleRef: e2e-r3-slice-writer
    subjects: {{serviceAccounts: [r3-vendor:inventory]}}
    resources: [resourceslices]
    reason: vendor inventory tool
    owner: e2e
    expires: "{(datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")}"
"""


@pytest.fixture(scope="module")
def guard(start_guard):
    return start_guard(
        namespaces=(NAMESPACE, "dra-system", "r2-team"),
        mode="enforce",
        extra_config="cluster:\n  apiCheckIntervalSeconds: 2\n" + VENDOR_EXCEPTION,
    )


POWERS = [
    ("apiservices", [{"apiGroups": ["apiregistration.k8s.io"], "resources": ["apiservices"], "verbs": ["patch"]}]),
    ("flowschemas", [{"apiGroups": ["flowcontrol.apiserver.k8s.io"], "resources": ["flowschemas"], "verbs": ["create"]}]),
    (
        "prioritylevelconfigurations",
        [{"apiGroups": ["flowcontrol.apiserver.k8s.io"], "resources": ["prioritylevelconfigurations"], "verbs": ["update"]}],
    ),
    (
        "certificatesigningrequests/nodeclient",
        [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/nodeclient"], "verbs": ["create"]}],
    ),
    (
        "certificatesigningrequests/selfnodeclient",
        [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/selfnodeclient"], "verbs": ["create"]}],
    ),
    ("pods", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]),
    ("namespaces", [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["patch"]}]),
    ("namespaces/status", [{"apiGroups": [""], "resources": ["namespaces/status"], "verbs": ["update"]}]),
    ("namespaces/finalize", [{"apiGroups": [""], "resources": ["namespaces/finalize"], "verbs": ["update"]}]),
    ("resourceclaims/binding", [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"], "verbs": ["patch"]}]),
    ("endpointslices", [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["create"]}]),
]


@pytest.mark.parametrize("power, rules", POWERS, ids=[p for p, _ in POWERS])
def test_an_rbac_manager_granting_a_power_around_rbac_is_refused_and_an_admins_grant_is_reported(
    control_plane, guard, power, rules
):
    cp = control_plane
    name = "e2e-r2-" + power.replace("/", "-")
    try:
        assert create(cp, "alice", cluster_role(name, rules)).returncode == 0  # a role alone grants nothing
        out = create(cp, "alice", bind(name, name, ALICE))
        assert out.returncode != 0 and DENIED in out.stderr and power in out.stderr, out.stderr
        # an admin's binding is not sent to dra-guard, and the audit reports it
        assert create(cp, "admin", bind(name, name, ALICE)).returncode == 0
        findings = cluster_audit(cp, guard)
        assert any(f["kind"] == "ClusterRoleBinding" and f["name"] == name and power in f["message"] for f in findings)
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found")


def cluster_audit(cp, guard):
    """The findings (JSON dicts) of `dra-guard audit --cluster` as an admin with the guard's config."""
    return audit_findings(cp, "--config", str(guard.workdir / "config.yaml"))


def test_a_rolebinding_that_allocates_devices_in_an_ordinary_namespace_is_refused_and_reported(control_plane, guard):
    """Claims are namespaced, devices are the cluster's: `cluster-admin` through a RoleBinding in a
    tenant's namespace gives resourceclaims/status and /binding there, i.e. another tenant's device
    for a claim of that namespace. alice's binding is refused naming the power; the built-in `admin`
    role (what a namespace owner needs) is not; an admin's such binding is reported."""
    cp = control_plane
    ns, team = "e2e-r3-tenant", [{"kind": "Group", "name": "e2e-r3-team", "apiGroup": RBAC}]
    cp.kubectl("admin", "create", "namespace", ns, check=False)
    try:
        out = create(cp, "alice", bind("e2e-r3-wide", "cluster-admin", team, namespace=ns))
        assert out.returncode != 0 and DENIED in out.stderr and "resourceclaims/binding" in out.stderr, out.stderr
        assert "deviceclasses" not in out.stderr  # a RoleBinding grants nothing cluster-scoped
        assert create(cp, "alice", bind("e2e-r3-owners", "admin", team, namespace=ns)).returncode == 0
        assert create(cp, "admin", bind("e2e-r3-wide", "cluster-admin", team, namespace=ns)).returncode == 0
        found = [(f["kind"], f.get("namespace"), f["name"]) for f in cluster_audit(cp, guard)]
        assert ("RoleBinding", ns, "e2e-r3-wide") in found
        assert ("RoleBinding", ns, "e2e-r3-owners") not in found
    finally:
        cp.kubectl("admin", "delete", "namespace", ns, "--ignore-not-found", "--wait=false")


def test_the_bootstrap_nodeclient_role_bound_by_an_rbac_manager_is_refused(control_plane, guard):
    role = "system:certificates.k8s.io:certificatesigningrequests:nodeclient"
    out = create(control_plane, "alice", bind("e2e-r2-bootstrap-nodeclient", role, ALICE))
    assert out.returncode != 0 and DENIED in out.stderr and "certificatesigningrequests/nodeclient" in out.stderr, out.stderr


def test_a_node_identity_from_a_csr_is_a_real_path_to_resourceslice_write(control_plane, guard):
    """Why create on certificatesigningrequests/nodeclient is a power: bob, given only that (by an
    admin), gets a kubelet client certificate for a node of his choosing auto-approved and signed,
    and as that node creates a ResourceSlice (fake devices) for it."""
    cp = control_plane
    node = "e2e-r2-node"
    cp.kubectl(
        "admin",
        "create",
        "clusterrole",
        "e2e-r2-csr",
        "--verb=create",
        "--resource=certificatesigningrequests,certificatesigningrequests.certificates.k8s.io/nodeclient",
    )
    cp.kubectl("admin", "create", "clusterrolebinding", "e2e-r2-csr", "--clusterrole=e2e-r2-csr", "--user=bob")
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                    x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
                ]
            )
        )
        .sign(key, hashes.SHA256())
    )
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": "e2e-r2-node"},
        "spec": {
            "request": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode(),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
        },
    }
    try:
        r = cp.session("bob").post(f"{cp.url}/apis/certificates.k8s.io/v1/certificatesigningrequests", json=body, timeout=10)
        assert r.status_code == 201, r.text

        def issued():
            obj = (
                cp.session("admin")
                .get(f"{cp.url}/apis/certificates.k8s.io/v1/certificatesigningrequests/e2e-r2-node", timeout=10)
                .json()
            )
            return (obj.get("status") or {}).get("certificate")

        cert = base64.b64decode(wait_for("the controller manager to approve and sign the CSR", issued, timeout=60))
        folder = guard.workdir / "node-identity"
        folder.mkdir(exist_ok=True)
        (folder / "tls.crt").write_bytes(cert)
        (folder / "tls.key").write_bytes(
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
        as_node = requests.Session()
        as_node.trust_env = False
        as_node.verify = str(cp.ca_file)
        as_node.cert = (str(folder / "tls.crt"), str(folder / "tls.key"))
        slice_ = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-fake"},
            "spec": {
                "driver": "gpu.example.com",
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "fake-0"}],
            },
        }
        r = as_node.post(f"{cp.url}/apis/resource.k8s.io/v1/resourceslices", json=slice_, timeout=10)
        assert r.status_code == 201, r.text  # the Node authorizer and NodeRestriction let "its" node write it
        # and bob's RBAC manager colleague may not hand out the same power
        out = create(cp, "alice", bind("e2e-r2-csr-alice", "e2e-r2-csr", ALICE))
        assert out.returncode != 0 and DENIED in out.stderr, out.stderr
    finally:
        cp.kubectl("admin", "delete", "resourceslice", f"{node}-fake", "--ignore-not-found")
        cp.kubectl("admin", "delete", "csr", "e2e-r2-node", "--ignore-not-found")
        cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", "e2e-r2-csr", "--ignore-not-found")


def test_a_driver_subjects_namespaced_powers_count_only_in_its_own_namespace(control_plane, guard):
    cp = control_plane
    sa = [{"kind": "ServiceAccount", "name": "driver", "namespace": "dra-system"}]
    role = cluster_role("e2e-r2-driver-ctrl", [{"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}])
    try:
        assert create(cp, "alice", role).returncode == 0
        assert create(cp, "alice", bind("e2e-r2-driver-own", "e2e-r2-driver-ctrl", sa, namespace="dra-system")).returncode == 0
        out = create(cp, "alice", bind("e2e-r2-driver-everywhere", "e2e-r2-driver-ctrl", sa))
        assert out.returncode != 0 and DENIED in out.stderr and "serviceaccounts/token" in out.stderr, out.stderr
    finally:
        cp.kubectl("admin", "delete", "rolebinding", "-n", "dra-system", "e2e-r2-driver-own", "--ignore-not-found")
        cp.kubectl("admin", "delete", "clusterrole", "e2e-r2-driver-ctrl", "--ignore-not-found")


def test_only_an_admin_gives_a_namespace_dra_admin_access(control_plane, guard):
    cp = control_plane
    cp.kubectl("admin", "create", "clusterrole", "e2e-r2-ns-patch", "--verb=get,patch,update", "--resource=namespaces")
    cp.kubectl("admin", "create", "clusterrolebinding", "e2e-r2-ns-patch", "--clusterrole=e2e-r2-ns-patch", "--user=bob")
    try:
        out = cp.kubectl("bob", "label", "namespace", "r2-team", f"{LABEL}=true", check=False)
        assert out.returncode != 0 and NS_DENIED in out.stderr and "rbac.adminSubjects" in out.stderr, out.stderr
        assert cp.kubectl("bob", "label", "namespace", "r2-team", "team=r2").returncode == 0  # other labels: never sent
        assert cp.kubectl("admin", "label", "namespace", "r2-team", f"{LABEL}=true").returncode == 0
        assert cp.kubectl("bob", "label", "namespace", "r2-team", "team=r2b", "--overwrite").returncode == 0
        assert cp.kubectl("bob", "label", "namespace", "r2-team", f"{LABEL}-").returncode == 0  # taking it away
        assert not any(f["check"] == "admin-access-namespace" and f["name"] == "r2-team" for f in audit_findings(cp))
        cp.kubectl("admin", "label", "namespace", "r2-team", f"{LABEL}=true")
        findings = audit_findings(cp)
        assert any(f["check"] == "admin-access-namespace" and f["name"] == "r2-team" for f in findings), findings
    finally:
        cp.kubectl("admin", "label", "namespace", "r2-team", f"{LABEL}-", check=False)
        cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", "e2e-r2-ns-patch", "--ignore-not-found")


def test_a_redirected_resource_api_makes_dra_guard_unready_within_one_check_interval(tmp_path):
    """On a control plane of its own: the aggregator's discovery of a built-in group stays stale
    for minutes after the APIService is set back, which would break the shared one's DRA API."""
    from tests.e2e import binaries
    from tests.e2e.cluster import ControlPlane

    name = "v1.resource.k8s.io"
    with ControlPlane(tmp_path / "cp", bin_dir=binaries.build_control_plane(), tools_dir=binaries.client_tools_dir()) as cp:
        cp.kubectl("admin", "create", "namespace", NAMESPACE)
        guard = Guard(cp, tmp_path / "guard")
        guard.start(mode="enforce", extra_config="cluster:\n  apiCheckIntervalSeconds: 2\n")
        try:

            def ready():
                r = guard.proc.session().get(guard.url + "/readyz", timeout=5)
                return r.status_code == 200, r.text

            wait_for("dra-guard ready", lambda: ready()[0], timeout=30)
            redirect = {
                "spec": {"service": {"namespace": "default", "name": "fake-dra-api", "port": 443}, "insecureSkipTLSVerify": True}
            }
            cp.kubectl("admin", "patch", "apiservice", name, "--type=merge", "-p", json.dumps(redirect))
            started = time.monotonic()
            wait_for("dra-guard unready", lambda: not ready()[0], timeout=10, interval=0.2)
            assert time.monotonic() - started < 2 + 3  # one check interval (2 s), plus the API read
            assert f"APIService {name} is served by Service default/fake-dra-api" in ready()[1]
            metrics = guard.proc.session().get(guard.url + "/metrics", timeout=5).text
            assert f'dra_guard_api_redirected{{apiservice="{name}"}} 1.0' in metrics
            log = [json.loads(line) for line in guard.proc.log().splitlines() if line.startswith("{")]
            assert any(e.get("msg") == "APIServices of the groups dra-guard reads" and e.get("redirected") for e in log)
        finally:
            guard.stop_server()


# ------------------------------------------------------------------ round 3: what reaches the webhook port


def test_forged_reviews_never_widen_what_dra_guard_allows(control_plane, guard):
    """The forged sequence, POSTed straight to the webhook port (no client certificate asked by
    default): a dry-run ClusterRole CREATE with DeviceClass write (it uses up the binding read of
    cluster.bindingRefreshIntervalSeconds), then a fake CREATE of the existing ClusterRoleBinding
    of bob naming only system:masters. The RBAC manager's real widening of bob's role after that
    must still be refused: a review is judged beside what the informers hold, never instead."""
    from tests.builders import review

    cp = control_plane
    name = "e2e-r3-forged"
    bob = [{"kind": "User", "name": "bob", "apiGroup": RBAC}]
    harmless = cluster_role(name, [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}])
    widened = cluster_role(
        name,
        [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["create"]},
        ],
    )
    try:
        assert create(cp, "alice", harmless).returncode == 0
        assert create(cp, "alice", bind(name, name, bob)).returncode == 0
        s = guard.proc.session()
        bait = cluster_role("e2e-r3-bait", widened["rules"])
        out = s.post(guard.url + "/validate/rbac", json=review(bait, dry_run=True), timeout=10).json()
        assert out["response"]["allowed"] is True  # bound to no one
        fake = bind(name, name, [{"kind": "Group", "name": "system:masters", "apiGroup": RBAC}])
        out = s.post(guard.url + "/validate/rbac", json=review(fake), timeout=10).json()
        assert out["response"]["allowed"] is True  # it gives a non-admin nothing
        out = cp.kubectl("alice", "replace", "-f", "-", input=json.dumps(widened), check=False)
        assert out.returncode != 0 and DENIED in out.stderr and "User bob" in out.stderr, out.stderr
        can = cp.kubectl("bob", "auth", "can-i", "create", "deviceclasses.resource.k8s.io", check=False)
        assert can.stdout.strip() == "no", can.stdout
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found")


@pytest.mark.parametrize("sub", ["status", "finalize"])
def test_the_admin_access_label_set_through_a_namespace_subresource_is_refused(control_plane, guard, sub):
    """The apiserver keeps label changes made through PUT .../namespaces/NAME/status and /finalize.
    bob, given update on the subresource by an admin (never sent to dra-guard; reported by the
    audit), still cannot label a Namespace for admin access: the chart sends those updates to
    namespaces.dra-guard.io too. Other labels through the same door pass."""
    cp = control_plane
    name = f"e2e-r3-ns-{sub}"
    ns = f"r3-{sub}"
    cp.kubectl("admin", "create", "namespace", ns, check=False)
    rules = [{"apiGroups": [""], "resources": ["namespaces", f"namespaces/{sub}"], "verbs": ["get", "update"]}]
    assert create(cp, "admin", cluster_role(name, rules)).returncode == 0
    assert create(cp, "admin", bind(name, name, [{"kind": "User", "name": "bob", "apiGroup": RBAC}])).returncode == 0
    url = f"{cp.url}/api/v1/namespaces/{ns}/{sub}"
    bob = cp.session("bob")
    try:

        def put(labels):
            obj = bob.get(f"{cp.url}/api/v1/namespaces/{ns}", timeout=10).json()
            obj["metadata"]["labels"] = {**obj["metadata"].get("labels", {}), **labels}
            return bob.put(url, json=obj, timeout=10)

        assert put({"team": "r3"}).status_code == 200  # the door is real: labels set through it are kept
        assert cp.kubectl("admin", "get", "namespace", ns, "-o", "jsonpath={.metadata.labels.team}").stdout == "r3"
        r = put({LABEL: "true"})
        assert r.status_code == 403 and "namespaces.dra-guard.io" in r.text, r.text
        got = cp.kubectl("admin", "get", "namespace", ns, "-o", "json").stdout
        assert LABEL not in json.loads(got)["metadata"].get("labels", {})
    finally:
        cp.kubectl("admin", "delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found")
        cp.kubectl("admin", "delete", "namespace", ns, "--wait=false", check=False)


def test_token_minting_where_an_excepted_serviceaccount_lives_is_refused(control_plane, guard):
    """The exception lets r3-vendor:inventory write ResourceSlices (its binding is stored); a Role
    and RoleBinding giving bob its tokens in r3-vendor would make bob that writer: refused, like
    in a driver's namespace."""
    cp = control_plane
    cp.kubectl("admin", "create", "namespace", "r3-vendor", check=False)
    cp.kubectl("admin", "create", "serviceaccount", "inventory", "-n", "r3-vendor", check=False)
    sa = [{"kind": "ServiceAccount", "name": "inventory", "namespace": "r3-vendor"}]
    writer = cluster_role(
        "e2e-r3-slice-writer", [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create"]}]
    )
    tokens = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "Role",
        "metadata": {"name": "e2e-r3-tokens", "namespace": "r3-vendor"},
        "rules": [{"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}],
    }
    minting = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "e2e-r3-tokens", "namespace": "r3-vendor"},
        "subjects": [{"kind": "User", "name": "bob", "apiGroup": RBAC}],
        "roleRef": {"kind": "Role", "name": "e2e-r3-tokens", "apiGroup": RBAC},
    }
    try:
        assert create(cp, "alice", writer).returncode == 0
        out = create(cp, "alice", bind("e2e-r3-inventory", "e2e-r3-slice-writer", sa))
        assert out.returncode == 0 and "allowed by exception" in out.stderr, out.stderr
        assert create(cp, "alice", tokens).returncode == 0  # a Role alone grants nothing
        out = create(cp, "alice", minting)
        assert out.returncode != 0 and DENIED in out.stderr and "serviceaccounts/token" in out.stderr, out.stderr
        can = cp.kubectl("bob", "auth", "can-i", "create", "serviceaccounts/token", "-n", "r3-vendor", check=False)
        assert can.stdout.strip() == "no", can.stdout
    finally:
        cp.kubectl("admin", "delete", "rolebinding,role", "e2e-r3-tokens", "-n", "r3-vendor", "--ignore-not-found")
        cp.kubectl("admin", "delete", "clusterrolebinding", "e2e-r3-inventory", "--ignore-not-found")
        cp.kubectl("admin", "delete", "clusterrole", "e2e-r3-slice-writer", "--ignore-not-found")


def test_pods_delete_in_a_driver_namespace_granted_by_an_rbac_manager_is_refused(control_plane, guard):
    """`pods delete`/`deletecollection` where a DRA driver runs takes the driver off its nodes (the
    DELETE itself is refused while claims need it): granting it there is an escalation power, like
    `pods patch`; the same RoleBinding in a tenant's namespace is allowed."""
    cp = control_plane
    name = "e2e-r2-pods-delete"
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete", "deletecollection"]}]
    try:
        assert create(cp, "alice", cluster_role(name, rules)).returncode == 0
        out = create(cp, "alice", bind(name, name, ALICE, namespace="dra-system"))
        assert out.returncode != 0 and DENIED in out.stderr and "pods" in out.stderr, out.stderr
        assert create(cp, "alice", bind(name, name, ALICE, namespace="r2-team")).returncode == 0
    finally:
        cp.kubectl("admin", "delete", "rolebinding", "-n", "r2-team", name, "--ignore-not-found")
        cp.kubectl("admin", "delete", "clusterrole", name, "--ignore-not-found")
