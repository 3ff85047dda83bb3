"""dra-guard as the kube-apiserver sees it: a real `dra-guard serve` registered as a webhook.

Guard starts `dra-guard serve` on loopback with the kubeconfig of its own user (whose only
permissions are tests/e2e/manifests/dra-guard-rbac.yaml), registers the webhook configuration
with clientConfig.url and caBundle, and waits until the apiserver really calls it (a probe
object that only dra-guard refuses).
"""
from __future__ import annotations

import base64
import pathlib
import string
import time

from tests.serve import DraGuardProcess, free_port

MANIFESTS = pathlib.Path(__file__).resolve().parent / "manifests"

BASE_CONFIG = """\
mode: {mode}
rbac:
  adminSubjects:
    groups: [system:masters]
  driverSubjects:
    serviceAccounts: ["dra-system:driver"]
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


class Guard:
    """A dra-guard server registered with a ControlPlane (tests.e2e.cluster).

    start(mode=...) (re)starts the server on the same port with that global mode; register()
    applies the webhook configuration; unregister() deletes it (break-glass); stop() ends both.
    """

    def __init__(self, cp, workdir: pathlib.Path) -> None:
        self.cp = cp
        self.workdir = workdir
        self.port = free_port()
        self.proc: DraGuardProcess | None = None
        self.mode = "enforce"
        cp.kubectl("admin", "apply", "-f", str(MANIFESTS / "dra-guard-rbac.yaml"))
        cp.kubectl("admin", "apply", "-f", str(MANIFESTS / "rbac-managers.yaml"))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self, *, mode: str = "enforce", extra_config: str = "") -> DraGuardProcess:
        """(Re)start dra-guard with global `mode`; wait until /readyz (caches synced)."""
        self.stop_server()
        self.mode = mode
        self.proc = DraGuardProcess(self.workdir, "--kubeconfig", str(self.cp.kubeconfig("dra-guard")),
                                    config=BASE_CONFIG.format(mode=mode) + extra_config, port=self.port)
        self.proc.wait("/readyz", timeout=60)
        return self.proc

    def register(self, *, failure_policy: str = "Fail") -> None:
        """Apply the webhook configuration and wait until the apiserver calls dra-guard."""
        assert self.proc is not None
        template = string.Template((MANIFESTS / "webhooks.yaml.tmpl").read_text())
        rendered = template.substitute(URL=self.url, FAILURE_POLICY=failure_policy,
                                       CA_BUNDLE=base64.b64encode(self.proc.ca_file.read_bytes()).decode())
        self.cp.kubectl("admin", "apply", "-f", "-", input=rendered)
        self.wait_called()

    def wait_called(self, timeout: float = 30.0) -> None:
        """Poll with a server-side dry run that only dra-guard refuses (or warns about) until it does."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.cp.kubectl("alice", "create", "--dry-run=server", "-f", "-", input=PROBE, check=False)
            if "dra-guard" in last.stderr or "dra-guard" in last.stdout:
                return
            time.sleep(0.3)
        raise TimeoutError(f"the apiserver did not call dra-guard within {timeout} s: {last.stderr if last else ''}")

    def unregister(self) -> None:
        """Delete the webhook configuration (the documented break-glass)."""
        self.cp.kubectl("admin", "delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", "dra-guard",
                        "--ignore-not-found")

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
