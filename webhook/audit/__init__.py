"""`dra-guard audit`: the admission policies over manifests (files, folders, stdin) and, with
--cluster, the live cluster's objects: load (reading and input problems), run (the audit, the
unresolved roleRefs, --scope files), render (table, json, yaml, sarif, junit), reports
(wgpolicyk8s.io PolicyReports, openreports.io Reports), suggest (--suggest-values: the Helm values that clear the driver findings), exception_entries
(--suggest-exception: config.exceptions entries for the findings)."""

from __future__ import annotations

from webhook.audit.exception_entries import suggest_exceptions
from webhook.audit.load import InputError, Manifests, load_manifests, read
from webhook.audit.render import render_json, render_junit, render_sarif, render_table, render_yaml
from webhook.audit.reports import OPENREPORTS, WGPOLICY, empty_cluster_report, policy_reports, render_reports
from webhook.audit.run import Audit, audit, config_from, exit_code, merge, only_files, run
from webhook.audit.suggest import suggest_values

__all__ = [
    "OPENREPORTS",
    "WGPOLICY",
    "Audit",
    "InputError",
    "Manifests",
    "audit",
    "config_from",
    "empty_cluster_report",
    "exit_code",
    "load_manifests",
    "merge",
    "only_files",
    "policy_reports",
    "read",
    "render_json",
    "render_junit",
    "render_reports",
    "render_sarif",
    "render_table",
    "render_yaml",
    "run",
    "suggest_exceptions",
    "suggest_values",
]
