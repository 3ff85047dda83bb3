"""helm pre-delete hook: delete dra-guard's webhook configurations before anything else goes.

Runs in dra-guard's own image (Python with the `kubernetes` package). Without it, an uninstall
could delete the Service first and leave a failurePolicy Fail webhook pointing at nothing, which
refuses every RBAC write in the cluster until someone deletes the configuration by hand.

Environment: WEBHOOK_CONFIGURATION (the name of both configurations). Exit 0 when both are gone
(already absent counts), 1 otherwise. Retries transient errors for up to 60 s.
"""
import os
import sys
import time

from kubernetes import client, config
from kubernetes.client.rest import ApiException


def load() -> None:
    """In-cluster credentials in the hook's pod, else the local kubeconfig (tests)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def delete_all(name: str, deadline: float) -> bool:
    """Delete both configurations named `name`; True when both are gone."""
    api = client.AdmissionregistrationV1Api()
    calls = [("validatingwebhookconfiguration", api.delete_validating_webhook_configuration),
             ("mutatingwebhookconfiguration", api.delete_mutating_webhook_configuration)]
    pending = list(calls)
    while pending:
        kind, delete = pending[0]
        try:
            delete(name)
            print(f"deleted {kind} {name}", flush=True)
            pending.pop(0)
        except ApiException as exc:
            if exc.status == 404:
                print(f"{kind} {name} already absent", flush=True)
                pending.pop(0)
            elif exc.status in (401, 403) or time.monotonic() > deadline:
                print(f"cannot delete {kind} {name}: {exc.status} {exc.reason}", file=sys.stderr, flush=True)
                return False
            else:
                time.sleep(2)
    return True


def main() -> int:
    """Entry point: delete the configurations named $WEBHOOK_CONFIGURATION."""
    load()
    return 0 if delete_all(os.environ["WEBHOOK_CONFIGURATION"], time.monotonic() + 60) else 1


if __name__ == "__main__":
    sys.exit(main())
