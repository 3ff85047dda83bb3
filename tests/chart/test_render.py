"""The Helm chart rendered by the real helm v4: lint, template, schema and what the objects say.

Every case of tests/chart/cases.py passes `helm lint --strict` and `helm template`; the rendered
config validates with webhook.config.from_mapping; the schema refuses bad values with a message
that names the key.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import pathlib
from typing import Any

import pytest
import yaml

from tests.chart import helm
from tests.chart.cases import CA_BUNDLE, DECLARED, case_ids, cases
from webhook.config import from_mapping

pytestmark = pytest.mark.e2e  # runs the real helm (fetched by tests.e2e.binaries)

CASES = dict(cases())


@functools.cache
def rendered(case: str) -> tuple[dict[str, Any], ...]:
    """The objects of one case (cached: each case is rendered once per session)."""
    return tuple(helm.template(values=CASES[case]))


def find(objs, kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of `kind` (and `name`); fails the test when absent."""
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name or ''}: found {len(found)}"
    return found[0]


def kinds(objs) -> list[str]:
    return sorted(o["kind"] for o in objs)


def config_of(objs) -> dict[str, Any]:
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {}))
    return yaml.safe_load(cm["data"]["config.yaml"])


def webhooks(objs) -> dict[str, dict[str, Any]]:
    """webhook name -> webhook, over both configurations."""
    out = {}
    for o in objs:
        if o["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            for w in o.get("webhooks") or []:
                out[w["name"]] = w
    return out


def container(objs) -> dict[str, Any]:
    return find(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


# ---------------------------------------------------------------- lint and template over the matrix
@pytest.mark.parametrize("case", case_ids())
def test_lint_strict_passes(case, tmp_path):
    out = helm.run("lint", "--strict", str(helm.CHART), *helm.values_args(CASES[case], tmp_path), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("case", case_ids())
def test_template_renders_valid_objects_and_config(case):
    objs = rendered(case)
    assert objs
    for o in objs:
        assert o.get("apiVersion") and o.get("kind") and o["metadata"].get("name"), o
    config = from_mapping(config_of(objs))  # raises ConfigError on an unknown key or a bad value
    values = CASES[case]
    assert config.mode == values.get("config", {}).get("mode", "enforce")
    for policy, settings in values.get("config", {}).get("policies", {}).items():
        assert config.policy(policy).mode == settings["mode"]
    assert config.certificates.mode == values.get("certificates", {}).get("mode", "self")
    names = {
        o["metadata"]["name"] for o in objs if o["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
    }
    assert names == {config.certificates.validating_webhook, config.certificates.mutating_webhook}
    assert config.certificates.service == find(objs, "Service")["metadata"]["name"]
    assert config.certificates.namespace == "dra-guard"


def test_chart_defaults_are_dra_guards_defaults():
    """values.yaml's config renders exactly dra-guard's built-in defaults (only certificates and the
    reports' owner differ: the chart names its own objects), so the chart and `dra-guard serve`
    without --config agree."""
    rendered_config = from_mapping(config_of(rendered("defaults")))
    assert rendered_config.audit.report_owner_cluster_role == "dra-guard"
    rendered_config = dataclasses.replace(
        rendered_config, audit=dataclasses.replace(rendered_config.audit, report_owner_cluster_role="")
    )
    builtin = from_mapping(None)
    fields = [f.name for f in dataclasses.fields(builtin) if f.name not in ("certificates", "ignored")]
    assert {"mode", "policies", "rbac", "probes", "eviction", "server", "cluster"} <= set(fields)
    for field in fields:
        assert getattr(rendered_config, field) == getattr(builtin, field), field
    assert rendered_config.ignored == ()


def test_default_objects():
    objs = rendered("defaults")
    assert kinds([o for o in objs if "helm.sh/hook" not in (o["metadata"].get("annotations") or {})]) == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "MutatingWebhookConfiguration",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingWebhookConfiguration",
        ]
    )
    assert not [o for o in objs if o["kind"] == "Job"], "the pre-delete Job is opt-in (preDelete.enabled)"
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"} == {"dra-guard"}


# ---------------------------------------------------------------- the Deployment
def test_deployment_is_highly_available_and_restricted():
    objs = rendered("defaults")
    dep = find(objs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 3
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert (
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"]
        == "kubernetes.io/hostname"
    )
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = pod["containers"][0]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]
    assert c["livenessProbe"]["httpGet"] == {"scheme": "HTTPS", "path": "/healthz", "port": "https"}
    assert c["readinessProbe"]["httpGet"] == {"scheme": "HTTPS", "path": "/readyz", "port": "https"}
    assert c["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    svc = find(objs, "Service")
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_every_pod_is_restricted():
    """Hook pods too: the test Pod and the pre-delete Job run under the same restrictions."""
    objs = rendered("pre-delete")
    pods = [
        find(objs, "Deployment")["spec"]["template"]["spec"],
        find(objs, "Job")["spec"]["template"]["spec"],
        find(objs, "Pod")["spec"],
    ]
    for pod in pods:
        for c in pod["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_hook_pods_are_not_behind_the_service():
    objs = rendered("pre-delete")
    selector = find(objs, "Service")["spec"]["selector"]
    for pod_labels in (find(objs, "Job")["spec"]["template"]["metadata"]["labels"], find(objs, "Pod")["metadata"]["labels"]):
        assert not selector.items() <= pod_labels.items(), pod_labels


def test_config_change_rolls_the_pods():
    before = find(rendered("defaults"), "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    after = find(rendered("global-audit"), "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    same = find(rendered("replicas-1"), "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert before != after and before == same


def test_restart_without_a_gap():
    """The settings that keep at least one replica answering through restarts,
    rollouts and drains (a single replica left the apiserver without an answer for 6-7 s per restart,
    and the eviction webhook's failurePolicy Ignore let driver evictions through meanwhile)."""
    objs = rendered("defaults")
    dep = find(objs, "Deployment")
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    config = from_mapping(config_of(objs))
    assert spec["replicas"] >= 2
    # a rollout first starts a new pod, and takes an old one away only once the new one has been ready a while
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert spec["minReadySeconds"] >= 5
    # voluntary disruptions (drains) take one replica at a time
    assert find(objs, "PodDisruptionBudget")["spec"]["maxUnavailable"] < spec["replicas"]
    # ready means serving: the Service sends reviews only to replicas whose caches and certificate are loaded
    c = pod["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["readinessProbe"]["periodSeconds"] <= 5
    # on SIGTERM a replica keeps serving shutdownDelaySeconds with readiness off, then drains (20 s)
    assert config.server.shutdown_delay_seconds >= 5
    assert pod["terminationGracePeriodSeconds"] >= config.server.shutdown_delay_seconds + 20
    one = find(rendered("replicas-1"), "Deployment")["spec"]
    assert one["strategy"]["rollingUpdate"]["maxUnavailable"] == 0  # even one replica is replaced surge-first


def test_review_deadline_and_drop_follow_the_webhooks_timeouts():
    """Every review is answered before its webhook's timeoutSeconds. The server's
    deadline is 0.5 s below the shortest enabled webhook timeout (a deadline of 2.5 s behind an
    eviction webhook of 2 s would let evictions through by failurePolicy Ignore); requests are
    dropped only once the longest timeout has passed (an RBAC webhook of 10 s still waits)."""

    def server(values):
        return from_mapping(config_of(helm.template(values=values))).server

    default = server({})
    assert (default.review_deadline_seconds, default.drop_after_seconds) == (2.5, 3)
    mixed = server({"webhooks": {"eviction": {"timeoutSeconds": 2}, "rbac": {"timeoutSeconds": 10}}})
    assert (mixed.review_deadline_seconds, mixed.drop_after_seconds) == (1.5, 10)
    rbac_only = server(
        {"webhooks": {"eviction": {"enabled": False}, "probes": {"enabled": False}, "rbac": {"timeoutSeconds": 5}}}
    )
    assert (rbac_only.review_deadline_seconds, rbac_only.drop_after_seconds) == (4.5, 5)
    explicit = server({"config": {"server": {"reviewDeadlineSeconds": 1.2}}, "webhooks": {"eviction": {"timeoutSeconds": 2}}})
    assert (explicit.review_deadline_seconds, explicit.drop_after_seconds) == (1.2, 3)


def test_each_policy_gets_the_deadline_of_its_own_webhook():
    """An RBAC webhook given 10 s (heavy GitOps writes) lets RBAC reviews use 9.5 s while evictions
    keep 1.5 s before their 2 s timeout; before, every policy got the shortest (1.5 s) and RBAC
    reviews past it were refused 503 though the apiserver still waited."""

    def config(values):
        return from_mapping(config_of(helm.template(values=values)))

    mixed = config(
        {
            "webhooks": {"eviction": {"timeoutSeconds": 2}, "rbac": {"timeoutSeconds": 10}},
            "config": {"policies": {"rbac": {"mode": "warn"}}},
        }
    )
    deadlines = {name: mixed.policy(name).review_deadline_seconds for name in ("rbac", "probes", "eviction")}
    # probes (3 s) and eviction (the shortest, 2 s) differ from the server's 1.5 s only where needed
    assert deadlines == {"rbac": 9.5, "probes": 2.5, "eviction": 0.0} and mixed.server.review_deadline_seconds == 1.5
    assert mixed.policy("rbac").mode == "warn"  # the policy's other settings are kept
    own = config({"config": {"policies": {"eviction": {"reviewDeadlineSeconds": 1.0}}}})
    assert own.policy("eviction").review_deadline_seconds == 1.0  # set in config: kept
    # an explicit server deadline applies to every policy without its own
    explicit = config({"config": {"server": {"reviewDeadlineSeconds": 1.2}}})
    assert {explicit.policy(n).review_deadline_seconds for n in ("rbac", "probes", "eviction")} == {0.0}
    off = config({"webhooks": {"probes": {"enabled": False}}})
    assert off.policy("probes").review_deadline_seconds == 0.0 and off.server.review_deadline_seconds == 2.5


def test_network_policy_by_default_opens_only_the_webhook_port_to_any_source():
    np = find(rendered("defaults"), "NetworkPolicy")
    dep = find(rendered("defaults"), "Deployment")
    assert np["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert np["spec"]["policyTypes"] == ["Ingress"]  # no egress rule: the apiserver is always reachable
    assert np["spec"]["ingress"] == [
        {"ports": [{"port": "https", "protocol": "TCP"}]}
    ]  # no `from`: the apiserver is never cut off
    assert "NetworkPolicy" not in kinds(rendered("no-network-policy"))


def test_client_auth_requires_the_apiserver_certificate_and_moves_probes_to_the_probe_port():
    objs = rendered("client-auth")
    config = from_mapping(config_of(objs))
    assert config.server.client_ca_file == "/etc/dra-guard/client-ca/ca.crt" and config.server.probe_port == 8444
    assert config.rbac.admin_subjects == from_mapping(config_of(rendered("defaults"))).rbac.admin_subjects  # merged, not replaced
    dep = find(objs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert {"name": "probes", "containerPort": 8444, "protocol": "TCP"} in c["ports"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] == "probes", probe
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["client-ca"]["mountPath"] == "/etc/dra-guard/client-ca" and mounts["client-ca"]["readOnly"] is True
    assert {"name": "client-ca", "configMap": {"name": "apiserver-client-ca"}} in pod["volumes"]
    np = find(objs, "NetworkPolicy")
    assert np["spec"]["ingress"] == [
        {"ports": [{"port": "https", "protocol": "TCP"}], "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]},
        {
            "ports": [{"port": "probes", "protocol": "TCP"}],
            "from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
    ]
    # without clientAuth the probes stay on the webhook port
    c0 = container(rendered("defaults"))
    assert c0["readinessProbe"]["httpGet"]["port"] == "https" and len(c0["ports"]) == 1


def test_pdb_only_with_more_than_one_replica():
    assert find(rendered("defaults"), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert "PodDisruptionBudget" not in kinds(rendered("replicas-1"))
    assert find(rendered("replicas-1"), "Deployment")["spec"]["replicas"] == 1


# ---------------------------------------------------------------- certificate modes
def test_self_mode_writes_to_a_memory_volume_and_renders_no_ca_bundle():
    objs = rendered("certs-self")
    c = container(objs)
    assert c["args"] == ["serve", "--config=/etc/dra-guard/config.yaml"]
    config = from_mapping(config_of(objs))
    assert config.certificates.extra_dns_names == ("dra-guard.example.com",)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in find(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    # the emptyDir (mode 0777, as Kubernetes makes every emptyDir) is mounted one level up: dra-guard
    # writes into its own 0700 subfolder and refuses a group/world-writable one (certs.secure_folder)
    folder = pathlib.PurePosixPath(config.certificates.dir)
    assert not folder.is_relative_to("/tmp") and str(folder.parent) in mounts and str(folder) not in mounts
    assert volumes[mounts[str(folder.parent)]]["emptyDir"]["medium"] == "Memory"
    assert volumes[mounts["/tmp"]]["emptyDir"]
    for w in webhooks(objs).values():
        assert "caBundle" not in w["clientConfig"]
    role = find(objs, "Role", "dra-guard")
    secret_rules = [r for r in role["rules"] if r["resources"] == ["secrets"]]
    assert {"get", "update"} <= set(next(r for r in secret_rules if r.get("resourceNames"))["verbs"])
    assert next(r for r in secret_rules if r.get("resourceNames"))["resourceNames"] == [config.certificates.secret_name]
    assert next(r for r in secret_rules if not r.get("resourceNames"))["verbs"] == ["create"]
    lease_rule = next(r for r in role["rules"] if r["resources"] == ["leases"])
    assert lease_rule["apiGroups"] == ["coordination.k8s.io"]
    patch_rule = next(
        r for r in find(objs, "ClusterRole", "dra-guard")["rules"] if r["apiGroups"] == ["admissionregistration.k8s.io"]
    )
    assert patch_rule["resourceNames"] == ["dra-guard"] and patch_rule["verbs"] == ["get", "patch"]


def test_self_mode_keeps_the_configurations_whole_from_the_webhooks_it_rendered():
    """docs/threat-model.md, path 5: the ConfigMap's webhooks.json is exactly the webhooks of the two
    configurations (so dra-guard restores what helm installed), the config names that ConfigMap,
    and the Role may read only it. Other modes render neither."""
    from certs import webhookspec

    objs = rendered("certs-self")
    cm = find(objs, "ConfigMap", "dra-guard")
    desired = webhookspec.parse_desired(cm["data"]["webhooks.json"])
    for kind, resource in (("validating", "ValidatingWebhookConfiguration"), ("mutating", "MutatingWebhookConfiguration")):
        assert desired[kind] == find(objs, resource)["webhooks"]
    assert [w["name"] for w in desired["validating"]] == [
        "rbac.dra-guard.io",
        "namespaces.dra-guard.io",
        "driver-evictions.dra-guard.io",
    ]
    assert from_mapping(config_of(objs)).certificates.webhooks_config_map == "dra-guard"
    rule = next(r for r in find(objs, "Role", "dra-guard")["rules"] if r["resources"] == ["configmaps"])
    assert rule == {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["dra-guard"], "verbs": ["get"]}
    for case in ("certs-cert-manager", "certs-files"):
        other = rendered(case)
        assert "webhooks.json" not in find(other, "ConfigMap", "dra-guard")["data"]
        assert from_mapping(config_of(other)).certificates.webhooks_config_map == ""


def test_cert_manager_mode():
    objs = rendered("certs-cert-manager")
    issuers = [o for o in objs if o["kind"] == "Issuer"]
    certs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Certificate"}
    assert [i["spec"] for i in issuers] == [{"selfSigned": {}}, {"ca": {"secretName": "dra-guard-ca"}}]
    assert certs["dra-guard-ca"]["spec"]["isCA"] is True
    serving = certs["dra-guard-serving"]["spec"]
    assert serving["dnsNames"] == [
        "dra-guard",
        "dra-guard.dra-guard",
        "dra-guard.dra-guard.svc",
        "dra-guard.dra-guard.svc.cluster.local",
    ]
    assert serving["issuerRef"]["name"] == "dra-guard-ca"
    c = container(objs)
    assert "--tls-cert-file=/etc/dra-guard/tls/tls.crt" in c["args"] and "--tls-key-file=/etc/dra-guard/tls/tls.key" in c["args"]
    volumes = {v["name"]: v for v in find(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == serving["secretName"]
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        assert find(objs, kind)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "dra-guard/dra-guard-serving"
    # no Secret access outside self mode (the Role only holds Leases: the shared records, the periodic audit's)
    assert all(r["resources"] == ["leases"] for r in find(objs, "Role", "dra-guard")["rules"])
    assert all(r["apiGroups"] != ["admissionregistration.k8s.io"] for r in find(objs, "ClusterRole", "dra-guard")["rules"])


def test_cert_manager_with_an_existing_issuer():
    objs = rendered("certs-cert-manager-issuer")
    assert "Issuer" not in kinds(objs)
    assert find(objs, "Certificate")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp-ca"}


def test_files_mode():
    objs = rendered("certs-files")
    volumes = {v["name"]: v for v in find(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "my-dra-guard-tls"
    assert "--tls-cert-file=/etc/dra-guard/tls/tls.crt" in container(objs)["args"]
    for w in webhooks(objs).values():
        assert w["clientConfig"]["caBundle"] == CA_BUNDLE
        assert w["clientConfig"]["service"]["name"] == "dra-guard"


# ---------------------------------------------------------------- webhook configurations
def test_webhooks_by_default():
    # no driver declared: no eviction is sent to dra-guard at all (none waits on it)
    assert set(webhooks(rendered("defaults"))) == {"rbac.dra-guard.io", "namespaces.dra-guard.io", "probes.dra-guard.io"}
    hooks = webhooks(rendered("declared-drivers"))
    assert set(hooks) == {
        "rbac.dra-guard.io",
        "namespaces.dra-guard.io",
        "probes.dra-guard.io",
        "driver-evictions.dra-guard.io",
        "evictions.dra-guard.io",
    }
    expected = {"rbac.dra-guard.io": ("Fail", "/validate/rbac"), "probes.dra-guard.io": ("Ignore", "/mutate/daemonsets")}
    for name, (policy, path) in expected.items():
        w = hooks[name]
        assert w["failurePolicy"] == policy and w["timeoutSeconds"] == 3
        assert w["sideEffects"] == "None" and w["admissionReviewVersions"] == ["v1"] and w["matchPolicy"] == "Equivalent"
        assert w["clientConfig"]["service"] == {"name": "dra-guard", "namespace": "dra-guard", "path": path, "port": 443}
        # drivers install in kube-system too; the RBAC guard reviews every namespace
        if name != "rbac.dra-guard.io":
            assert w["namespaceSelector"] == {
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["dra-guard"]}]
            }
    rbac = hooks["rbac.dra-guard.io"]
    # Roles/RoleBindings in kube-system and dra-guard's own namespace are reviewed
    assert "namespaceSelector" not in rbac or rbac["namespaceSelector"] == {}
    assert rbac["rules"] == [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["clusterroles", "clusterrolebindings", "roles", "rolebindings"],
            "scope": "*",
        }
    ]
    expression = rbac["matchConditions"][0]["expression"]
    for who in (
        "system:apiserver",
        "system:kube-controller-manager",
        "system:serviceaccount:kube-system:clusterrole-aggregation-controller",
    ):
        assert who in expression
    assert "startsWith" not in expression  # no longer every kube-system ServiceAccount
    eviction_rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["pods/eviction"],
        "scope": "Namespaced",
    }
    delete_rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["DELETE"],
        "resources": ["pods"],
        "scope": "Namespaced",
    }
    if "driver-evictions.dra-guard.io" in hooks:  # guardDeletes is on by default
        assert hooks["driver-evictions.dra-guard.io"]["rules"] == [eviction_rule, delete_rule]
    if "evictions.dra-guard.io" in hooks:  # the best-effort webhook never gets DELETE
        assert hooks["evictions.dra-guard.io"]["rules"] == [eviction_rule]
    assert hooks["probes.dra-guard.io"]["rules"][0]["resources"] == ["daemonsets"]
    assert hooks["probes.dra-guard.io"]["reinvocationPolicy"] == "Never"


def test_declared_drivers_pods_alone_go_to_the_fail_closed_eviction_webhook():
    """config.drivers.declared renders one webhook with failurePolicy Fail whose namespaceSelector
    and matchConditions select those DaemonSets' pods (<name>-<suffix>) and nothing else; the
    best-effort webhook (bestEffort.enabled) takes every other pod with Ignore and a 1 s timeout."""
    hooks = webhooks(rendered("declared-drivers"))
    driver, other = hooks["driver-evictions.dra-guard.io"], hooks["evictions.dra-guard.io"]
    assert (driver["failurePolicy"], driver["timeoutSeconds"]) == ("Fail", 3)
    assert driver["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gpu-operator", "kube-system"]}]
    }
    evictions = (
        "(request.namespace == 'gpu-operator' && request.name.startsWith('nvidia-dra-driver-gpu-kubelet-plugin-'))"
        " || (request.namespace == 'kube-system' && request.name.startsWith('dra-example-driver-kubeletplugin-'))"
    )
    deletes = (
        "(request.namespace == 'gpu-operator' && oldObject.metadata.ownerReferences.exists(o, o.kind == 'DaemonSet'"
        " && o.name == 'nvidia-dra-driver-gpu-kubelet-plugin'))"
        " || (request.namespace == 'kube-system' && oldObject.metadata.ownerReferences.exists(o, o.kind == 'DaemonSet'"
        " && o.name == 'dra-example-driver-kubeletplugin'))"
    )
    # an eviction names the pod; a DELETE (each pod of a deletecollection too, with no request
    # name) carries the pod whose controller ownerReference names the DaemonSet
    pods = f"request.operation == 'DELETE' ? (has(oldObject.metadata.ownerReferences) && ({deletes})) : ({evictions})"
    conditions = {c["name"]: c["expression"] for c in driver["matchConditions"]}
    assert conditions["declared-driver-pod"] == pods
    assert set(conditions) == {"declared-driver-pod", "not-already-stopped", "not-garbage-collector"}
    assert (other["failurePolicy"], other["timeoutSeconds"]) == ("Ignore", 1)
    assert other["matchConditions"] == [{"name": "not-declared-driver-pod", "expression": f"!({pods})"}]
    assert other["namespaceSelector"]["matchExpressions"][0]["values"] == ["dra-guard"]
    # dra-guard itself reads the same list (its audit reports drivers missing from it)
    config = from_mapping(config_of(rendered("declared-drivers")))
    assert [(d.namespace, d.name) for d in config.detection.declared] == [(d["namespace"], d["name"]) for d in DECLARED]


def test_a_declared_daemonset_named_with_58_or_more_characters_is_matched_by_its_pods_cut_name():
    """The apiserver cuts a generateName prefix to 58 characters (names.SimpleNameGenerator), so
    the pods of DaemonSet <63 characters> are named <its first 58> + 5: the eviction condition
    matches that cut prefix, the DELETE condition the ownerReference's whole name."""
    name = "dra-driver-cpu-" + "r" * 48  # 63 characters
    values = {"webhooks": {"caBundle": CA_BUNDLE}, "config": {"drivers": {"declared": [{"namespace": "cpu", "name": name}]}}}
    driver = webhooks(helm.template(values=values))["driver-evictions.dra-guard.io"]
    [expression] = [c["expression"] for c in driver["matchConditions"] if c["name"] == "declared-driver-pod"]
    assert f"request.name.startsWith('{name[:58]}')" in expression
    assert f"o.name == '{name}'" in expression


@pytest.mark.parametrize(
    "declared, message",
    [
        (
            [{"namespace": "dra-guard", "name": "d"}],
            "config.drivers.declared[0].namespace: dra-guard is dra-guard's own namespace",
        ),
        ([{"namespace": "gpu", "name": "d') || true || ('"}], "/config/drivers/declared/0/name"),
        ([{"namespace": "gpu"}], "name"),
    ],
)
def test_a_declared_driver_the_webhook_cannot_select_safely_stops_the_install(declared, message):
    out = helm.template_text(values={"config": {"drivers": {"declared": declared}}}, check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr


@pytest.mark.parametrize("case", ["global-audit", "rbac-audit", "probes-audit", "eviction-audit"])
def test_audit_mode_never_blocks_its_webhooks_are_ignore(case):
    """A policy in audit mode only records: its webhook is rendered with failurePolicy Ignore, so
    a dra-guard not yet Ready (or whose image cannot be pulled) blocks nothing; the others keep theirs."""
    own = {"rbac": "Fail", "probes": "Ignore", "eviction": "Fail"}
    names = {
        "rbac": ["rbac.dra-guard.io", "namespaces.dra-guard.io"],
        "probes": ["probes.dra-guard.io"],
        "eviction": ["driver-evictions.dra-guard.io"],
    }
    hooks = webhooks(rendered(case))
    audited = case.split("-")[0]
    for policy, hook_names in names.items():
        for name in hook_names:
            expected = "Ignore" if audited in ("global", policy) else own[policy]
            assert hooks[name]["failurePolicy"] == expected, (case, name)
    # switching back to enforce restores each policy's own failurePolicy
    enforce = webhooks(rendered(case.replace("audit", "enforce")))
    assert {n: enforce[n]["failurePolicy"] for hs in names.values() for n in hs} == {
        n: own[p] for p, hs in names.items() for n in hs
    }


def test_install_without_an_image_fails_naming_image_repository(tmp_path):
    """No placeholder image: without image.repository `helm install` stops at render time, never
    creating a Deployment that cannot pull and a Fail webhook nothing answers."""
    args = ["install", "dra-guard", str(helm.CHART), "--namespace", "dra-guard", "--dry-run=client"]
    out = helm.run(*args, *helm.values_args(None, tmp_path, base=False), check=False)
    assert out.returncode != 0 and "image.repository is empty" in out.stderr, out.stderr
    assert "--set image.repository=REGISTRY/dra-guard" in out.stderr
    assert helm.run(*args, "--set", "image.repository=registry.example/dra-guard", check=False).returncode == 0


def test_dev_url_points_every_webhook_at_the_url():
    for w in webhooks(rendered("dev-url")).values():
        assert "service" not in w["clientConfig"]
        assert w["clientConfig"]["url"].startswith("https://127.0.0.1:8443/")
        assert w["clientConfig"]["caBundle"] == CA_BUNDLE
    assert webhooks(rendered("dev-url"))["rbac.dra-guard.io"]["clientConfig"]["url"] == "https://127.0.0.1:8443/validate/rbac"


def test_switches():
    objs = rendered("switches")
    hooks = webhooks(objs)
    assert "probes.dra-guard.io" not in hooks
    assert hooks["rbac.dra-guard.io"]["timeoutSeconds"] == 5
    driver = hooks["driver-evictions.dra-guard.io"]
    assert driver["failurePolicy"] == "Fail"
    assert {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["DELETE"],
        "resources": ["pods"],
        "scope": "Namespaced",
    } in driver["rules"]
    assert driver["namespaceSelector"]["matchExpressions"][0] == {
        "key": "kubernetes.io/metadata.name",
        "operator": "In",
        "values": ["gpu"],
    }
    # the DaemonSet controller's deletes are judged (a rolling update that brings no pod back is
    # refused); pods already stopped and the garbage collector's deletes never wait on dra-guard
    conditions = {c["name"]: c["expression"] for c in driver["matchConditions"]}
    assert "not-daemonset-controller" not in conditions
    assert conditions["not-garbage-collector"] == (
        "!(request.operation == 'DELETE' && request.userInfo.username in "
        '["system:serviceaccount:kube-system:generic-garbage-collector"])'
    )
    assert "has(oldObject.metadata.deletionTimestamp)" in conditions["not-already-stopped"]
    assert "['Succeeded', 'Failed']" in conditions["not-already-stopped"]
    # the RBAC guard reviews kube-system and its own namespace; only excludedNamespaces stay out
    assert hooks["rbac.dra-guard.io"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["gpu-operator"]
    assert find(objs, "MutatingWebhookConfiguration", "guard").get("webhooks") is None
    c = container(objs)
    assert c["image"] == "registry.example/dra-guard@sha256:" + "a" * 64
    assert c["args"][-2:] == ["--log-level", "debug"]
    assert "Job" not in kinds(objs) and "Pod" not in kinds(objs)
    config = from_mapping(config_of(objs))
    assert config.eviction.guard_deletes is True
    assert config.rbac.driver_subjects.service_accounts == frozenset({"gpu-operator:nvidia-dra-driver"})


@pytest.mark.parametrize("mode", ["enforce", "warn", "audit"])
def test_helm_test_pod_knows_the_rbac_mode(mode):
    pod = find(rendered(f"rbac-{mode}"), "Pod")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["RBAC_MODE"] == mode and env["FAILURE_POLICY"] == "Fail"


# ---------------------------------------------------------------- least privilege
CACHE_RULES = [
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["clusterroles", "clusterrolebindings", "roles", "rolebindings"],
        "verbs": ["list", "watch"],
    },
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["list", "watch"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceslices"], "verbs": ["list", "watch"]},
    # readiness: the APIServices of the groups it reads are served locally
    {"apiGroups": ["apiregistration.k8s.io"], "resources": ["apiservices"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},  # RBAC drift Events
]
AUDIT_RULES = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["list"]},
]
REPORT_RULES = [  # both report APIs: config.audit.reportFormat chooses, the other's reports are deleted
    {"apiGroups": ["wgpolicyk8s.io"], "resources": ["policyreports", "clusterpolicyreports"], "verbs": ["list", "create"]},
    {
        "apiGroups": ["wgpolicyk8s.io"],
        "resources": ["policyreports", "clusterpolicyreports"],
        "resourceNames": ["dra-guard"],
        "verbs": ["get", "update", "delete"],
    },
    {"apiGroups": ["openreports.io"], "resources": ["reports", "clusterreports"], "verbs": ["list", "create"]},
    {
        "apiGroups": ["openreports.io"],
        "resources": ["reports", "clusterreports"],
        "resourceNames": ["dra-guard"],
        "verbs": ["get", "update", "delete"],
    },
    # the reports' owner: its own ClusterRole's uid (config.audit.reportOwnerClusterRole)
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "resourceNames": ["dra-guard"], "verbs": ["get"]},
]
SELF_RULES = [
    {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
        "resourceNames": ["dra-guard"],
        "verbs": ["get", "patch"],
    },
]


@pytest.mark.parametrize(
    "case,expected",
    [
        ("audit-off-files", CACHE_RULES),
        ("certs-files", CACHE_RULES + AUDIT_RULES + REPORT_RULES),
        ("audit-no-reports", CACHE_RULES + AUDIT_RULES + SELF_RULES),
        ("defaults", CACHE_RULES + AUDIT_RULES + REPORT_RULES + SELF_RULES),
    ],
)
def test_cluster_role_is_exactly_what_the_code_needs(case, expected):
    """Caches: list/watch only; the periodic audit adds its lists and its PolicyReports; self mode
    adds get/patch on its own two webhook configurations, by name."""
    assert find(rendered(case), "ClusterRole", "dra-guard")["rules"] == expected


@pytest.mark.parametrize(
    "release,values",
    [
        ("dra-guard", {}),
        ("dg", {}),
        ("dg", {"fullnameOverride": "guard-x"}),
        ("dg", {"config": {"audit": {"reportFormat": "both"}}}),
    ],
)
def test_the_reports_owner_is_the_releases_own_cluster_role_which_dra_guard_may_get(release, values):
    """The config names the ClusterRole this release creates (helm uninstall deletes it, the garbage
    collector then deletes the reports), and that ClusterRole lets dra-guard get itself by name and
    nothing more of ClusterRoles than its caches' list/watch."""
    objs = helm.template(values=values, release=release, namespace="ns")
    config = from_mapping(config_of(objs))
    [role] = [o for o in objs if o["kind"] == "ClusterRole" and "helm.sh/hook" not in (o["metadata"].get("annotations") or {})]
    name = role["metadata"]["name"]
    assert config.audit.report_owner_cluster_role == name
    crb = find(objs, "ClusterRoleBinding", name)
    assert crb["roleRef"]["name"] == name and crb["subjects"][0]["name"] == container_sa(objs)
    on_roles = [r for r in role["rules"] if "clusterroles" in r["resources"]]
    assert {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["clusterroles"],
        "resourceNames": [name],
        "verbs": ["get"],
    } in on_roles
    assert all(set(r["verbs"]) <= {"list", "watch"} for r in on_roles if not r.get("resourceNames"))


def test_without_reports_there_is_no_get_on_the_cluster_role():
    role = find(rendered("audit-no-reports"), "ClusterRole", "dra-guard")
    assert not [r for r in role["rules"] if r.get("resourceNames") and "clusterroles" in r["resources"]]


def container_sa(objs) -> str:
    return find(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]


def test_namespaced_roles():
    # the eviction guard's shared records need the Lease verbs in every mode, the periodic audit off included
    leases = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update", "delete"]}]
    files = rendered("audit-off-files")
    assert find(files, "Role", "dra-guard")["rules"] == leases
    assert find(files, "RoleBinding", "dra-guard")["roleRef"]["name"] == "dra-guard"
    own = find(rendered("certs-files"), "Role", "dra-guard")
    assert own["metadata"]["namespace"] == "dra-guard"
    assert own["rules"] == leases
    system = find(rendered("defaults"), "Role", "dra-guard-audit")
    assert system["metadata"]["namespace"] == "kube-system"
    assert system["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]
    binding = find(rendered("defaults"), "RoleBinding", "dra-guard-audit")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dra-guard", "namespace": "dra-guard"}]
    config = from_mapping(config_of(rendered("audit-no-reports")))
    assert config.audit.interval_seconds == 300 and config.audit.policy_reports is False


def test_rbac_bindings():
    objs = rendered("certs-files")
    crb = find(objs, "ClusterRoleBinding", "dra-guard")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "dra-guard", "namespace": "dra-guard"}]
    pre_delete = find(rendered("pre-delete"), "ClusterRole", "dra-guard-pre-delete")
    assert pre_delete["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
            "resourceNames": ["dra-guard"],
            "verbs": ["delete"],
        },
        # then its reports (`dra-guard hook pre-delete --delete-reports`): list finds them, all named dra-guard
        {"apiGroups": ["wgpolicyk8s.io"], "resources": ["policyreports", "clusterpolicyreports"], "verbs": ["list"]},
        {
            "apiGroups": ["wgpolicyk8s.io"],
            "resources": ["policyreports", "clusterpolicyreports"],
            "resourceNames": ["dra-guard"],
            "verbs": ["delete"],
        },
        {"apiGroups": ["openreports.io"], "resources": ["reports", "clusterreports"], "verbs": ["list"]},
        {
            "apiGroups": ["openreports.io"],
            "resources": ["reports", "clusterreports"],
            "resourceNames": ["dra-guard"],
            "verbs": ["delete"],
        },
    ]


def test_hooks():
    objs = rendered("pre-delete")
    job = find(objs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    # never left behind, never retried for long: helm waits for it and aborts the uninstall on failure
    assert set(job["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation",
        "hook-succeeded",
        "hook-failed",
    }
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] <= 60
    # its RBAC is created with the release, not at uninstall time (that would need dra-guard up)
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert "helm.sh/hook" not in (find(objs, kind, "dra-guard-pre-delete")["metadata"].get("annotations") or {})
    pod = find(objs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    tester = find(objs, "ClusterRole", "dra-guard-test")
    assert tester["rules"] == [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterrolebindings"], "verbs": ["create"]},
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "resourceNames": ["dra-guard-test-slice-writer"],
            "verbs": ["bind"],
        },
    ]
    # both hooks run dra-guard's own subcommands, which the CLI knows
    test_container, hook_container = pod["spec"]["containers"][0], job["spec"]["template"]["spec"]["containers"][0]
    assert test_container["command"] + test_container["args"] == ["dra-guard", "hook", "test"]
    assert hook_container["command"] + hook_container["args"] == ["dra-guard", "hook", "pre-delete", "--delete-reports"]
    from webhook.cli.parser import build_parser

    for container in (test_container, hook_container):
        args = build_parser().parse_args(container["args"])
        assert (args.command, args.hook_command) == tuple(container["args"][:2])
    assert build_parser().parse_args(hook_container["args"]).delete_reports is True


# ---------------------------------------------------------------- monitoring
def test_monitoring_objects():
    objs = rendered("monitoring")
    sm = find(objs, "ServiceMonitor")
    ep = sm["spec"]["endpoints"][0]
    assert ep["port"] == "https" and ep["scheme"] == "https" and ep["path"] == "/metrics"
    assert ep["tlsConfig"]["ca"]["secret"] == {"name": "dra-guard-tls", "key": "ca-bundle.crt"}
    assert ep["tlsConfig"]["serverName"] == "dra-guard.dra-guard.svc"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["selector"]["matchLabels"].items() <= find(objs, "Service")["metadata"]["labels"].items()
    rule = find(objs, "PrometheusRule")
    assert [g["name"] for g in rule["spec"]["groups"]] == ["dra-guard", "dra-control-plane"]
    dashboard = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "dra-guard-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["dra-guard.json"])["uid"] == "dra-guard"
    assert not {"ServiceMonitor", "PrometheusRule"} & set(kinds(rendered("defaults")))
    cm = rendered("monitoring-cert-manager")
    assert find(cm, "ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"] == {
        "name": "dra-guard-serving-cert",
        "key": "ca.crt",
    }
    assert [g["name"] for g in find(cm, "PrometheusRule")["spec"]["groups"]] == ["dra-guard"]


def test_alerts_link_their_runbooks_at_the_configured_base():
    """monitoring.prometheusRule.runbookBaseURL is the page every alert's runbook_url points into
    (a copy on an internal wiki, say), each alert at its own anchor."""
    base = "https://wiki.example.com/ops/dra-guard-runbooks"
    objs = helm.template(values={"monitoring": {"prometheusRule": {"enabled": True, "runbookBaseURL": base}}})
    rules = [r for g in find(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert len(rules) >= 20
    for rule in rules:
        assert rule["annotations"]["runbook_url"] == f"{base}#{rule['alert'].lower()}", rule["alert"]
    default = [r for g in find(rendered("monitoring"), "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert {r["annotations"]["runbook_url"].partition("#")[0] for r in default} == {
        "https://github.com/dra-guard/dra-guard/blob/main/docs/runbooks.md"
    }


# ---------------------------------------------------------------- schema
BAD_VALUES = [
    ({"config": {"mode": "sometimes"}}, "/config/mode", "value must be one of 'enforce', 'warn', 'audit'"),
    ({"config": {"policies": {"eviction": {"mode": "sometimes"}}}}, "/config/policies/eviction/mode", "must be one of"),
    ({"config": {"policies": {"rbac": {"failureMode": "maybe"}}}}, "/config/policies/rbac/failureMode", "'deny', 'allow'"),
    ({"webhooks": {"rbac": {"timeoutSeconds": 40}}}, "/webhooks/rbac/timeoutSeconds", "maximum: got 40, want 30"),
    ({"webhooks": {"eviction": {"timeoutSeconds": 0}}}, "/webhooks/eviction/timeoutSeconds", "minimum: got 0, want 1"),
    ({"webhooks": {"probes": {"failurePolicy": "Maybe"}}}, "/webhooks/probes/failurePolicy", "'Fail', 'Ignore'"),
    ({"certificates": {"mode": "manual"}}, "/certificates/mode", "'self', 'cert-manager', 'files'"),
    ({"certificates": {"mode": "files"}}, "/certificates/files/secretName", "minLength"),
    ({"replicaCount": "three"}, "/replicaCount", "got string, want integer"),
    ({"config": {"server": {"port": "8443"}}}, "/config/server/port", "got string, want integer"),
    (
        {"config": {"rbac": {"adminSubjects": {"serviceAccounts": ["no-colon"]}}}},
        "/config/rbac/adminSubjects/serviceAccounts/0",
        "does not match pattern",
    ),
    ({"config": {"certificates": {"mode": "self"}}}, "/config", "additional properties 'certificates' not allowed"),
    ({"config": {"bogus": 1}}, "/config", "additional properties 'bogus' not allowed"),
    ({"webhooks": {"url": "http://127.0.0.1:8443"}}, "/webhooks/url", "does not match pattern"),
    (
        {"config": {"exceptions": [{"policy": "rbac", "kind": "ClusterRoleBinding", "name": "b", "reason": "r", "owner": "o"}]}},
        "/config/exceptions/0",
        "missing property 'expires'",
    ),
    (
        {
            "config": {
                "exceptions": [
                    {
                        "policy": "rbac",
                        "kind": "ClusterRole",
                        "name": "b",
                        "reason": "r",
                        "owner": "o",
                        "expires": "2027-01-01T00:00:00Z",
                    }
                ]
            }
        },
        "/config/exceptions/0/kind",
        "'ClusterRoleBinding'",
    ),
    (
        {"monitoring": {"prometheusRule": {"thresholds": {"errorRatio": "high"}}}},
        "/monitoring/prometheusRule/thresholds/errorRatio",
        "got string, want number",
    ),
    (
        {"monitoring": {"prometheusRule": {"runbookBaseURL": "docs/runbooks.md"}}},
        "/monitoring/prometheusRule/runbookBaseURL",
        "does not match pattern",
    ),
    (
        {"monitoring": {"prometheusRule": {"runbookBaseURL": "https://wiki.example.com/runbooks#top"}}},
        "/monitoring/prometheusRule/runbookBaseURL",
        "does not match pattern",
    ),
]


@pytest.mark.parametrize("values,path,message", BAD_VALUES, ids=[p for _, p, _ in BAD_VALUES])
def test_schema_refuses_bad_values_naming_the_key(values, path, message):
    out = helm.template_text(values=values, check=False)
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr
    assert f"at '{path}'" in out.stderr and message in out.stderr, out.stderr


def test_chart_metadata():
    chart = yaml.safe_load((helm.CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == "0.2.0"
    import tomllib

    project = tomllib.loads((helm.REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_values_comments_say_why():
    """Every non-obvious value carries a comment (cert-manager's and Gatekeeper's style)."""
    text = (helm.CHART / "values.yaml").read_text()
    for key in (
        "failurePolicy: Fail",
        "failurePolicy: Ignore",
        "timeoutSeconds: 3",
        "replicaCount: 3",
        "priorityClassName:",
        "maxUnavailable: 1",
        "mode: self",
        "url:",
        "caBundle:",
    ):
        line_no = next(i for i, line in enumerate(text.splitlines()) if line.strip().startswith(key))
        window = text.splitlines()[max(0, line_no - 3) : line_no + 1]
        assert any("#" in line for line in window), f"{key} has no comment: {window}"


def _notes_and_webhooks(tmp_path, values) -> tuple[str, dict[str, str]]:
    """(NOTES as `helm install --dry-run=client` prints them, {webhook name: its failurePolicy} of
    the same rendering)."""
    out = helm.run(
        "install",
        "dra-guard",
        str(helm.CHART),
        "--namespace",
        "dra-guard",
        "--dry-run=client",
        *helm.values_args(values, tmp_path),
    ).stdout
    manifests, notes = out.split("NOTES:", 1)
    policies = {
        hook["name"]: hook["failurePolicy"]
        for doc in yaml.safe_load_all(manifests.split("MANIFEST:", 1)[1])
        if doc and doc["kind"].endswith("WebhookConfiguration")
        for hook in doc["webhooks"]
    }
    return notes, policies


def test_notes_say_modes_audit_to_enforce_and_break_glass(tmp_path):
    notes, _ = _notes_and_webhooks(tmp_path, {"config": {"mode": "audit", "policies": {"rbac": {"mode": "enforce"}}}})
    assert "rbac      mode enforce  webhook failurePolicy Fail, timeout 3s" in notes
    assert "probes    mode audit    webhook failurePolicy Ignore, timeout 3s" in notes
    assert "eviction  mode audit" in notes
    assert "--set config.mode=enforce" in notes and "dra-guard audit --cluster" in notes
    assert "kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration dra-guard" in notes
    assert "helm test dra-guard" in notes


DRIVERS = {"config": {"drivers": {"declared": [{"namespace": "gpu", "name": "gpu-driver"}]}}}


@pytest.mark.parametrize("mode", ["audit", "enforce"])
@pytest.mark.parametrize("drivers", [False, True], ids=["no-drivers", "drivers"])
def test_notes_say_what_happens_when_dra_guard_is_down_as_the_rendered_webhooks_do(tmp_path, mode, drivers):
    """Every sentence of NOTES about failure behaviour matches the failurePolicy of the webhook it
    describes in the same rendering: audit mode never says anything is refused."""
    values: dict[str, Any] = {"config": {"mode": mode, **(DRIVERS["config"] if drivers else {})}}
    notes, policies = _notes_and_webhooks(tmp_path, values)
    said = {
        "rbac.dra-guard.io": "RBAC writes and admin-access labels of non-admins: ",
        "namespaces.dra-guard.io": "RBAC writes and admin-access labels of non-admins: ",
        "driver-evictions.dra-guard.io": "evictions of declared driver pods: ",
        "probes.dra-guard.io": "driver DaemonSet writes: ",
    }
    for hook, lead in said.items():
        line = next(line for line in notes.splitlines() if line.strip().startswith(lead.strip()))
        if hook not in policies:  # not rendered: nothing is sent to dra-guard
            assert "not sent" in line, (hook, line)
        elif policies[hook] == "Fail":
            assert "refused (failurePolicy Fail" in line, (hook, line)
        else:
            assert "failurePolicy Ignore" in line and "refused" not in line, (hook, line)
    if mode == "audit":
        assert "failurePolicy Fail" not in notes and "fail closed" not in notes, notes
        assert set(policies.values()) == {"Ignore"}, policies
    if drivers:
        declared = next(line for line in notes.splitlines() if line.startswith("Declared DRA drivers"))
        closed = policies["driver-evictions.dra-guard.io"] == "Fail"
        assert ("fail closed" in declared) is closed, declared


def test_notes_commands_use_the_chart_installed_from_and_the_documented_upgrade_flags(tmp_path):
    """The helm commands NOTES print: --reset-then-reuse-values (docs/operations/upgrades.md: a
    plain --reuse-values drops values after a failed revision), the additive extra*Subjects lists,
    the chart reference the release came from (notes.chartReference), never ./charts/dra-guard."""
    notes, _ = _notes_and_webhooks(tmp_path, {"config": {"mode": "audit"}})
    commands = [line.strip() for line in notes.splitlines() if line.strip().startswith("helm upgrade")]
    assert commands, notes
    for command in commands:
        assert "./charts/dra-guard" not in command and " --reuse-values" not in command, command
        assert "--reset-then-reuse-values" in command, command
        assert "oci://REGISTRY/charts/dra-guard --version " in command, command
    assert "extraAdminSubjects" in notes and "extraDriverSubjects" in notes
    notes, _ = _notes_and_webhooks(tmp_path, {"notes": {"chartReference": "oci://r.example/charts/dra-guard --version 9.9.9"}})
    assert "helm upgrade dra-guard oci://r.example/charts/dra-guard --version 9.9.9 -n dra-guard" in notes


def test_every_value_in_values_yaml_is_in_the_schema():
    schema = json.loads((helm.CHART / "values.schema.json").read_text())
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and node.get("type") == "object" and "properties" in node:
            for key, sub in value.items():
                assert key in node["properties"] or node.get("additionalProperties") is not False, f"{path}.{key}"
                if key in node["properties"]:
                    walk(sub, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "")


def test_ca_bundle_in_cases_is_base64():
    assert base64.b64decode(CA_BUNDLE).startswith(b"-----BEGIN CERTIFICATE-----")


def test_rendered_files_are_plain_yaml(tmp_path):
    """The chart's own files parse (the rules file only after rendering, it is a template)."""
    json.loads((helm.CHART / "files" / "dashboard.json").read_text())
    yaml.safe_load((helm.CHART / "values.yaml").read_text())
    assert pathlib.Path(helm.CHART / "templates" / "NOTES.txt").exists()


def test_admins_are_left_out_of_the_rbac_webhook_from_the_same_list_dra_guard_trusts():
    from webhook.config import NEVER_PRIVILEGED_GROUPS, NEVER_PRIVILEGED_USERS

    admins = {
        "groups": ["system:masters", "kubeadm:cluster-admins", *sorted(NEVER_PRIVILEGED_GROUPS), "system:serviceaccounts:team-a"],
        "users": ["root-admin", *sorted(NEVER_PRIVILEGED_USERS)],
        "serviceAccounts": ["kube-system:*", "ops:deployer"],
    }
    objs = helm.template(values={"config": {"rbac": {"adminSubjects": admins}}})
    rbac = webhooks(objs)["rbac.dra-guard.io"]
    conditions = {c["name"]: c["expression"] for c in rbac["matchConditions"]}
    expr = conditions["not-admin"]
    assert '"system:masters"' in expr and '"kubeadm:cluster-admins"' in expr
    assert '"root-admin"' in expr and '"system:serviceaccount:ops:deployer"' in expr
    assert '"system:serviceaccount:kube-system:"' in expr
    for never in [*NEVER_PRIVILEGED_GROUPS, *NEVER_PRIVILEGED_USERS, "system:serviceaccounts:team-a"]:
        assert f'"{never}"' not in expr, never
    # the eviction and probes webhooks judge admins too (an admin's drain must keep the order)
    objs = helm.template(
        values={
            "config": {"rbac": {"adminSubjects": admins}, "drivers": {"declared": DECLARED}},
            "webhooks": {"eviction": {"bestEffort": {"enabled": True}}},
        }
    )
    for name in ("driver-evictions.dra-guard.io", "evictions.dra-guard.io", "probes.dra-guard.io"):
        assert not any(c["name"] == "not-admin" for c in webhooks(objs)[name].get("matchConditions") or [])


def _not_admin(objs) -> str:
    return next(c["expression"] for c in webhooks(objs)["rbac.dra-guard.io"]["matchConditions"] if c["name"] == "not-admin")


def test_one_extra_admin_set_on_the_command_line_keeps_the_default_admins():
    """`--set` replaces a list: set on extraAdminSubjects it adds ops:admin, and both dra-guard's
    config and the RBAC webhook's matchConditions still hold every default admin."""
    from webhook.config import KUBE_SYSTEM_CONTROLLERS, RbacConfig

    objs = helm.template(extra=["--set", "config.rbac.extraAdminSubjects.serviceAccounts={ops:admin}"])
    expr = _not_admin(objs)
    for entry in sorted(KUBE_SYSTEM_CONTROLLERS):
        assert f'"system:serviceaccount:{entry}"' in expr, entry
    assert '"system:serviceaccount:ops:admin"' in expr
    assert '"system:masters"' in expr and '"system:kube-controller-manager"' in expr
    admins = from_mapping(config_of(objs)).rbac.admin_subjects
    assert admins.service_accounts == KUBE_SYSTEM_CONTROLLERS | {"ops:admin"}
    assert admins.groups == RbacConfig().admin_subjects.groups and admins.users == RbacConfig().admin_subjects.users
    # the extra driver list reaches dra-guard's config; drivers are never left out of the webhook
    objs = helm.template(extra=["--set", "config.rbac.extraDriverSubjects.serviceAccounts={gpu:driver}"])
    assert from_mapping(config_of(objs)).rbac.driver_subjects.service_accounts == {"gpu:driver"}
    assert "gpu:driver" not in _not_admin(objs)


def test_matchconditions_read_the_three_service_account_spellings_like_dra_guard():
    extra = {
        "serviceAccounts": ["ops/a", "system:serviceaccount:ops:b", "ops:c", "team/*", "system:serviceaccount:ci:*"],
        "groups": ["system:masters", "ops-admins"],
        "users": ["alice"],
    }
    objs = helm.template(values={"config": {"rbac": {"extraAdminSubjects": extra}}})
    expr = _not_admin(objs)
    for user in ("ops:a", "ops:b", "ops:c"):
        assert f'"system:serviceaccount:{user}"' in expr, user
    assert '"system:serviceaccount:team:"' in expr and '"system:serviceaccount:ci:"' in expr
    assert '"ops-admins"' in expr and '"alice"' in expr
    assert expr.count('"system:masters"') == 1  # listed twice, rendered once
    assert "/" not in expr
    admins = from_mapping(config_of(objs)).rbac.admin_subjects
    assert {"ops:a", "ops:b", "ops:c", "team:*", "ci:*"} <= admins.service_accounts


def test_release_and_namespace_names_that_yaml_reads_as_booleans_render_as_strings():
    """A release named `y` or a namespace `on` (YAML 1.1 booleans) must stay strings in labels
    and namespaces, or the apiserver refuses the objects ("cannot unmarshal bool")."""
    for obj in helm.template(
        release="y",
        namespace="on",
        values={
            "monitoring": {
                "serviceMonitor": {"enabled": True},
                "prometheusRule": {"enabled": True},
                "dashboard": {"enabled": True},
            }
        },
    ):
        meta = obj["metadata"]
        for key, value in (meta.get("labels") or {}).items():
            assert isinstance(value, str), (obj["kind"], key, value)
        if "namespace" in meta:
            assert meta["namespace"] in ("on", "kube-system"), (obj["kind"], meta)


def test_installed_policyreport_crds_are_kept_on_uninstall():
    """Deleting a CRD deletes every object of it, other tools' reports included: `helm uninstall`
    must leave the report CRDs (helm.sh/resource-policy: keep)."""
    crds = [o for o in rendered("policyreport-crds") if o["kind"] == "CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == ["clusterpolicyreports.wgpolicyk8s.io", "policyreports.wgpolicyk8s.io"]
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


@pytest.mark.parametrize(
    "report_format, expected",
    [
        ("wgpolicyk8s.io", ["clusterpolicyreports.wgpolicyk8s.io", "policyreports.wgpolicyk8s.io"]),
        ("openreports.io", ["clusterreports.openreports.io", "reports.openreports.io"]),
        (
            "both",
            [
                "clusterpolicyreports.wgpolicyk8s.io",
                "clusterreports.openreports.io",
                "policyreports.wgpolicyk8s.io",
                "reports.openreports.io",
            ],
        ),
    ],
)
def test_installcrds_installs_the_crds_of_the_chosen_report_format(report_format, expected):
    objs = helm.template(values={"policyReports": {"installCRDs": True}, "config": {"audit": {"reportFormat": report_format}}})
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == expected
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not [
        o
        for o in helm.template(values={"config": {"audit": {"reportFormat": report_format}}})
        if o["kind"] == "CustomResourceDefinition"
    ]  # installCRDs is off by default


def test_sizing_page_matches_the_chart_defaults_and_the_measured_figures():
    """The operations page "Sizing" (docs/operations/sizing.md) names the chart's default memory request and limit, and every row's
    limit is above the worker's peak plus the periodic audit's process's peak (both run in the
    server's container at once) that bench/results measured for that size."""
    readme = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations" / "sizing.md").read_text()
    rows = [
        line
        for line in readme.split("# Sizing", 1)[1].split("\n\n", 3)[2].splitlines()
        if line.startswith("| ") and "MiB" in line
    ]
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())["resources"]
    default_row = next(r for r in rows if "(default)" in r)
    assert f"{values['requests']['memory']} (default)" in default_row and f"{values['limits']['memory']} (default)" in default_row
    results = pathlib.Path(__file__).resolve().parents[2] / "bench" / "results" / "unreleased"

    def mib(quantity: str) -> float:
        return float(quantity[:-2]) * (1024 if quantity.endswith("Gi") else 1)

    for row, measured in zip(rows, ("envelope-today.json", "envelope.json"), strict=True):
        run = next(iter(json.loads((results / measured).read_text())["runs"].values()))
        limit = row.split("|")[6].strip().split()[0]
        audit = run["during_audit"]["done"]["auditPeakRssMiB"]
        assert f"{run['peak_rss_mib']:.0f} MiB" in row and f"{audit:.0f} MiB" in row, row
        assert mib(limit) > run["peak_rss_mib"] + audit, row


def test_host_network_extra_env_and_rolling_update_reach_every_pod_the_chart_makes():
    """hostNetwork, extraEnv and rollingUpdate (values.yaml): the server, the `helm test` pod and the
    pre-delete Job all get the node's network and the extra variables (each calls the apiserver);
    by default none of them, and the rollout never goes below replicaCount ready replicas."""
    env = [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}, {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]
    objs = helm.template(
        values={
            "hostNetwork": True,
            "extraEnv": env,
            "preDelete": {"enabled": True},
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        }
    )
    specs = [
        find(objs, "Deployment")["spec"]["template"]["spec"],
        find(objs, "Pod")["spec"],
        find(objs, "Job")["spec"]["template"]["spec"],
    ]
    for spec in specs:
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        container_env = spec["containers"][0]["env"]
        assert all(var in container_env for var in env), container_env
        assert container_env[-2:] == env  # after the chart's own, as given
    assert find(objs, "Deployment")["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    default = helm.template(values={"preDelete": {"enabled": True}})
    for spec in (
        find(default, "Deployment")["spec"]["template"]["spec"],
        find(default, "Pod")["spec"],
        find(default, "Job")["spec"]["template"]["spec"],
    ):
        assert "hostNetwork" not in spec and "dnsPolicy" not in spec
        assert not any(v["name"].startswith("KUBERNETES_") for v in spec["containers"][0]["env"])
    assert find(default, "Deployment")["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    with pytest.raises(helm.HelmError):
        helm.template(values={"extraEnv": [{"value": "no name"}]})


def test_an_exception_in_the_values_reaches_the_config_dra_guard_reads():
    import datetime

    expires = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry = {
        "policy": "probes",
        "kind": "DaemonSet",
        "namespace": "gpu",
        "name": "legacy-driver",
        "reason": "no health endpoint",
        "owner": "team-gpu",
        "expires": expires,
    }
    config = config_of(helm.template(values={"config": {"exceptions": [entry]}}))
    (exception,) = from_mapping(config).exceptions
    assert exception.ref == "probes DaemonSet gpu/legacy-driver" and exception.owner == "team-gpu"
