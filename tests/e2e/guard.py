"""dra-guard as the kube-apiserver sees it: a real `dra-guard serve` registered as a webhook.

Guard starts `dra-guard serve` on loopback with the kubeconfig of its own user, whose only
permissions are the Helm chart's ClusterRole and namespaced Roles (charts/dra-guard, rendered with
`helm template` and bound to User "dra-guard"; the Leases of the eviction guard's shared records
are written in NAMESPACE, as with no $POD_NAMESPACE). It registers the Validating/MutatingWebhookConfiguration the chart
renders with its development value `webhooks.url` (clientConfig.url = this server, caBundle = its
CA), so the chart's rules, namespaceSelectors and matchConditions are what the tests exercise,
and waits until the apiserver really calls it (a probe object that only dra-guard refuses).
"""

from __future__ import annotations

import base64
import json
import pathlib
import time
from typing import Any

from tests.chart import helm
from tests.scrape import metric, scrape
from tests.serve import DraGuardProcess, free_port

MANIFESTS = pathlib.Path(__file__).resolve().parent / "manifests"
#: The namespace the chart is rendered for: it is never sent to dra-guard (namespaceSelector).
NAMESPACE = "dra-guard"
USER = "dra-guard"

BASE_CONFIG = """\
mode: {mode}
rbac:
  adminSubjects:
    groups: [system:masters]
  driverSubjects:
    serviceAccounts: {driver_service_accounts}
  driverResources: {driver_resources}
{drivers}audit:
  intervalSeconds: 0
"""

PROBE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: dra-guard-probe
subjects:
  - {kind: Group, name: dra-guard-probe, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: cluster-admin, apiGroup: rbac.authorization.k8s.io}
"""


#: The apiserver's refusal when dra-guard's RBAC webhook denies: the exact text only its answer produces.
DENIED = 'admission webhook "rbac.dra-guard.io" denied the request'
#: ... and when the fail-closed eviction webhook (declared drivers' pods) refuses an eviction.
EVICTION_REFUSED = 'admission webhook "driver-evictions.dra-guard.io" denied the request'
#: kubectl's line for a warning header dra-guard returned (its warnings start with "dra-guard:").
WARNED = "Warning: dra-guard:"


def called(stderr: str, *, mode: str) -> bool:
    """Whether kubectl's stderr for PROBE shows dra-guard's answer in `mode` (enforce: DENIED,
    warn: WARNED; audit answers leave no trace here). The probe's own name (dra-guard-probe) is
    echoed by the apiserver in its own messages ("... dra-guard-probe created (server dry run)",
    or RBAC's "forbidden"), so it never counts."""
    if mode == "enforce":
        return DENIED in stderr
    if mode == "warn":
        return WARNED in stderr
    return False


class Guard:
    """A dra-guard server registered with a ControlPlane (tests.e2e.cluster).

    The periodic audit is off (audit.intervalSeconds 0): its lists would be counted among the API
    requests reviews cause, and tests of it start their own server (test_cluster_audit.py).
    start(mode=...) (re)starts the server on the same port with that global mode; register()
    applies the webhook configuration; unregister() deletes it (break-glass); stop() ends both.
    """

    def __init__(self, cp, workdir: pathlib.Path) -> None:
        self.cp = cp
        self.workdir = workdir
        self.port = free_port()
        self.proc: DraGuardProcess | None = None
        self.mode = "enforce"
        self.declared: tuple[tuple[str, str], ...] = ()
        self.driver_resources: tuple[str, ...] = ("resourceslices",)
        cp.kubectl("admin", "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": chart_rbac()}))
        # the chart's Role in its namespace: the eviction guard's shared records (Leases) are written there
        cp.kubectl("admin", "create", "namespace", NAMESPACE, check=False)
        cp.kubectl(
            "admin", "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": chart_namespaced_rbac()})
        )
        cp.kubectl("admin", "apply", "-f", str(MANIFESTS / "rbac-managers.yaml"))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(
        self,
        *,
        mode: str = "enforce",
        extra_config: str = "",
        driver_service_accounts: tuple[str, ...] = ("dra-system:driver",),
        declared: tuple[tuple[str, str], ...] | None = None,
        ready_timeout: float = 60.0,
        driver_resources: tuple[str, ...] = ("resourceslices",),
    ) -> DraGuardProcess:
        """(Re)start dra-guard with global `mode`, rbac.driverSubjects.serviceAccounts
        ("namespace:name"), rbac.driverResources and drivers.declared ((namespace, DaemonSet name)
        pairs; None keeps the last start's, which register() also renders into the chart's eviction
        webhook); wait until /readyz (caches synced), at most ready_timeout seconds."""
        self.stop_server()
        self.mode = mode
        self.driver_resources = tuple(driver_resources)
        if declared is not None:
            self.declared = tuple(declared)
        self.proc = DraGuardProcess(
            self.workdir,
            "--kubeconfig",
            str(self.cp.kubeconfig("dra-guard")),
            config=BASE_CONFIG.format(
                mode=mode,
                driver_service_accounts=json.dumps(list(driver_service_accounts)),
                driver_resources=json.dumps(list(driver_resources)),
                # no drivers section when none is declared (its default): bench.compare runs this
                # harness against versions from before drivers.declared
                drivers=f"drivers:\n  declared: {json.dumps(declared_values(self.declared))}\n" if self.declared else "",
            )
            + extra_config,
            port=self.port,
        )
        self.proc.wait("/readyz", timeout=ready_timeout)
        return self.proc

    def register(self, *, failure_policy: str = "Fail") -> None:
        """Apply the webhook configuration and wait until the apiserver calls dra-guard."""
        assert self.proc is not None
        configs = webhook_configurations(
            url=self.url, ca_file=self.proc.ca_file, failure_policy=failure_policy, declared=self.declared
        )
        self.cp.kubectl("admin", "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": configs}))
        self.wait_called()

    def wait_called(self, timeout: float = 30.0) -> None:
        """Poll with a server-side dry run of PROBE until dra-guard's own answer to it is seen.

        Only what dra-guard's real answer produces counts (never a name in the probe itself, which
        the apiserver echoes in its own messages): enforce, the apiserver's denial naming the
        webhook (DENIED); warn, kubectl's "Warning: dra-guard:" line (dra-guard's warning header);
        audit, which leaves no trace in the answer, one more rbac review in dra-guard's
        dra_guard_admission_requests_total. Raises TimeoutError after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            before = self.reviews_counted()
            last = self.cp.kubectl("alice", "create", "--dry-run=server", "-f", "-", input=PROBE, check=False)
            if called(last.stderr, mode=self.mode) or (self.mode == "audit" and self.reviews_counted() > before):
                return
            time.sleep(0.3)
        raise TimeoutError(
            f"the apiserver did not call dra-guard within {timeout} s: {(last.stdout + last.stderr) if last else ''}"
        )

    def reviews_counted(self) -> float:
        """dra-guard's count of answered rbac reviews (every decision, every mode), from /metrics."""
        if self.proc is None:
            return 0.0
        return metric(scrape(self.proc), "dra_guard_admission_requests_total", policy="rbac", default=0.0)

    def unregister(self) -> None:
        """Delete the webhook configuration (the documented break-glass)."""
        self.cp.kubectl(
            "admin", "delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", "dra-guard", "--ignore-not-found"
        )

    def stop_server(self) -> None:
        """Stop the dra-guard process (the configuration stays)."""
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def stop(self) -> None:
        """Unregister, then stop the server: never leave a Fail webhook pointing at nothing."""
        try:
            self.unregister()
        finally:
            self.stop_server()


def chart_rbac() -> list[dict[str, Any]]:
    """The chart's ClusterRole for dra-guard and a ClusterRoleBinding of it to User "dra-guard".

    Rendered with certificates.mode=cert-manager: the rules dra-guard needs when it is given its
    serving files, as this test server is (self mode would add get/patch on its webhook
    configurations, which `serve --self-signed` never uses).
    """
    docs = helm.template(
        values={"certificates": {"mode": "cert-manager"}}, namespace=NAMESPACE, show_only=["templates/rbac.yaml"]
    )
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": role["metadata"]["name"]},
        "subjects": [{"kind": "User", "name": USER, "apiGroup": "rbac.authorization.k8s.io"}],
        "roleRef": {"kind": "ClusterRole", "name": role["metadata"]["name"], "apiGroup": "rbac.authorization.k8s.io"},
    }
    return [role, binding]


def chart_namespaced_rbac() -> list[dict[str, Any]]:
    """The chart's namespaced Roles (its Leases, the periodic audit's included, in NAMESPACE; list on
    kube-system's ConfigMaps) with their RoleBindings bound to User "dra-guard" instead of the
    chart's ServiceAccount: what the periodic audit needs to run as in a release."""
    docs = helm.template(
        values={"certificates": {"mode": "cert-manager"}}, namespace=NAMESPACE, show_only=["templates/rbac.yaml"]
    )
    user = [{"kind": "User", "name": USER, "apiGroup": "rbac.authorization.k8s.io"}]
    return [d for d in docs if d["kind"] == "Role"] + [{**d, "subjects": user} for d in docs if d["kind"] == "RoleBinding"]


def declared_values(declared: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    """drivers.declared entries for (namespace, DaemonSet name) pairs."""
    return [{"namespace": ns, "name": name} for ns, name in declared]


def webhook_configurations(
    *,
    url: str,
    ca_file: pathlib.Path,
    failure_policy: str = "Fail",
    declared: tuple[tuple[str, str], ...] = (),
    values: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The chart's ValidatingWebhookConfiguration and MutatingWebhookConfiguration (release
    "dra-guard" in namespace NAMESPACE) pointing at `url` with `ca_file` as caBundle; the RBAC
    webhook's failurePolicy is `failure_policy`; config.drivers.declared is `declared` ((namespace,
    DaemonSet name) pairs: the pods whose evictions go to the fail-closed webhook); `values` are
    merged over that (one level deep per top-level key)."""
    values = {
        "webhooks": {
            "url": url,
            "caBundle": base64.b64encode(ca_file.read_bytes()).decode(),
            "rbac": {"failurePolicy": failure_policy},
            **(values or {}).get("webhooks", {}),
        },
        "config": {"drivers": {"declared": declared_values(declared)}, **(values or {}).get("config", {})},
        **{k: v for k, v in (values or {}).items() if k not in ("webhooks", "config")},
    }
    return helm.template(values=values, namespace=NAMESPACE, show_only=["templates/webhooks.yaml"])
