"""`dra-guard audit --suggest-values`: the Helm values that would clear the audit's driver findings.

Two kinds of finding are a driver's: the ``rbac-write`` findings of a ServiceAccount refused
ResourceSlice write and nothing a driver subject may not hold (namespaced powers count only through
a RoleBinding in its own namespace), cleared by rbac.extraDriverSubjects; and an
``undeclared-driver`` finding, cleared by drivers.declared. Everything else needs an admin's
judgement (adminSubjects lifts every check) and is never suggested.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from webhook.config import Config
from webhook.model.powers import NAMESPACE_POWER_NAMES
from webhook.model.rbac import Subject
from webhook.policies.decision import Finding

HEADER = (
    "# dra-guard audit --suggest-values: Helm values that clear the driver findings of this audit.\n"
    "# Apply with (these lists replace the ones set before, so the entries already configured are\n"
    "# repeated here):\n"
    "#   helm upgrade RELEASE CHART -n NAMESPACE --reset-then-reuse-values -f THIS_FILE\n"
)


def driver_service_accounts(findings: Iterable[Finding], config: Config) -> list[str]:
    """ "ns:name" of every ServiceAccount whose ``rbac-write`` findings rbac.driverSubjects would
    all clear: each refused resource is a driver resource, or a namespaced power bound in the
    ServiceAccount's own namespace, and one of them is a driver resource. Sorted."""
    rbac = config.rbac
    writers: set[str] = set()
    blocked: set[str] = set()
    for f in findings:
        if f.check != "rbac-write":
            continue
        subject = Subject.parse(str(f.details.get("subject", "")))
        if subject is None or subject.kind != "ServiceAccount":
            continue
        resources = set(f.details.get("resources") or ())
        own = f.details.get("bindingNamespace") == subject.namespace
        entry = f"{subject.namespace}:{subject.name}"
        if resources & rbac.driver_resources:
            writers.add(entry)
        # one finding a driver subject would not clear (an admin-only resource, powers elsewhere)
        # makes it no plain driver: an admin judges it, nothing is suggested
        if not resources <= rbac.driver_resources | (NAMESPACE_POWER_NAMES if own else frozenset()):
            blocked.add(entry)
    return sorted(writers - blocked)


def undeclared_drivers(findings: Iterable[Finding]) -> list[tuple[str, str]]:
    """(namespace, name) of every ``undeclared-driver`` finding's DaemonSet, sorted."""
    return sorted({(f.namespace, f.name) for f in findings if f.check == "undeclared-driver"})


def suggest_values(findings: Iterable[Finding], config: Config) -> str:
    """The Helm values YAML (under ``config:``) that adds the driver ServiceAccounts to
    rbac.extraDriverSubjects.serviceAccounts and the undeclared drivers to drivers.declared, each
    with the entries `config` already holds and a comment line saying why it is safe; ``config: {}``
    when no finding is a driver's."""
    findings = list(findings)
    rbac = config.rbac
    accounts = [sa for sa in driver_service_accounts(findings, config) if sa not in rbac.driver_subjects.service_accounts]
    declared = [d for d in undeclared_drivers(findings) if not config.detection.is_declared(*d)]
    if not accounts and not declared:
        return HEADER + "# No finding is a driver's: nothing to add.\nconfig: {}\n"
    lines = ["config:"]
    if accounts:
        known = sorted(rbac.extra_driver_subjects.service_accounts | set(accounts))
        lines += [
            "  rbac:",
            "    extraDriverSubjects:",
            f"      # Safe: driver subjects may write only {', '.join(sorted(rbac.driver_resources))} "
            f"(rbac.driverResources), never {', '.join(sorted(rbac.admin_only_resources))};",
            "      # namespaced powers only through RoleBindings in their own namespace.",
            "      serviceAccounts:",
        ]
        lines += [f"        - {json.dumps(sa)}" for sa in known]
    if declared:
        pairs = list(dict.fromkeys([(d.namespace, d.name) for d in config.detection.declared] + declared))
        lines += [
            "  drivers:",
            "    # Safe: a declared driver only has its pods' evictions fail closed (sent to dra-guard,",
            "    # refused while a claim still needs the pod on its node or while dra-guard is down).",
            "    declared:",
        ]
        lines += [f"      - {{namespace: {json.dumps(ns)}, name: {json.dumps(name)}}}" for ns, name in pairs]
    return HEADER + "\n".join(lines) + "\n"
