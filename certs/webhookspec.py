"""The webhook configurations as the chart rendered them, compared whole with the live ones.

In `certificates.mode: self` dra-guard may patch its own ValidatingWebhookConfiguration and
MutatingWebhookConfiguration (it keeps their caBundle). Anyone else who can write them can add a
matchCondition that skips their own requests, widen a namespaceSelector, turn a failurePolicy to
Ignore or point a webhook elsewhere, and dra-guard stays ready (docs/threat-model.md, path 5). So the chart
renders the webhooks it wants (ConfigMap key `webhooks.json`: {"validating": [webhook, ...],
"mutating": [webhook, ...]}, each an admissionregistration.k8s.io/v1 webhook dict without
caBundle) and the Reconciler compares them whole with the live objects and restores them.

The live objects carry the apiserver's defaults for every field the chart leaves out
(admissionregistration.k8s.io/v1 defaulting: failurePolicy Fail, matchPolicy Equivalent,
namespaceSelector and objectSelector {}, timeoutSeconds 10, rules[].scope "*",
clientConfig.service.port 443, reinvocationPolicy Never for mutating webhooks), so both sides
are normalised before they are compared; caBundle is left out of the comparison (the Reconciler
keeps it on its own).

Pure functions over plain dicts; nothing here talks to the API.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

KINDS = ("validating", "mutating")

# admissionregistration.k8s.io/v1 defaults (k8s.io/api/admissionregistration/v1 types.go, the
# "+default" and "Defaults to" notes of each field)
_WEBHOOK_DEFAULTS: dict[str, Any] = {
    "failurePolicy": "Fail",
    "matchPolicy": "Equivalent",
    "namespaceSelector": {},
    "objectSelector": {},
    "timeoutSeconds": 10,
}
_MUTATING_DEFAULTS: dict[str, Any] = {"reinvocationPolicy": "Never"}


def parse_desired(text: str) -> dict[str, list[dict[str, Any]]]:
    """The desired webhooks from the chart's `webhooks.json` text.

    Returns {"validating": [...], "mutating": [...]} (a kind left out or null is an empty list).
    Raises ValueError naming what is wrong: not JSON, not an object, a kind that is not a list,
    a webhook that is not an object or has no string `name`, or two webhooks with one name.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"webhooks.json is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("webhooks.json must be an object with the keys validating and mutating")
    unknown = sorted(set(doc) - set(KINDS))
    if unknown:
        raise ValueError(f"webhooks.json has unknown keys {unknown}; expected validating and mutating")
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        hooks = doc.get(kind)
        hooks = [] if hooks is None else hooks
        if not isinstance(hooks, list):
            raise ValueError(f"webhooks.json: {kind} must be a list of webhooks")
        names: set[str] = set()
        for i, hook in enumerate(hooks):
            if not isinstance(hook, dict) or not isinstance(hook.get("name"), str) or not hook["name"]:
                raise ValueError(f"webhooks.json: {kind}[{i}] must be a webhook object with a name")
            if hook["name"] in names:
                raise ValueError(f"webhooks.json: {kind} has two webhooks named {hook['name']!r}")
            names.add(hook["name"])
        out[kind] = hooks
    return out


def normalized(webhook: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """One webhook with the apiserver's defaults filled in and clientConfig.caBundle removed.

    webhook: an admissionregistration.k8s.io/v1 webhook dict; kind: "validating" or "mutating".
    Empty lists and objects the apiserver drops (matchConditions: []) compare equal to absent.
    """
    out = copy.deepcopy(dict(webhook))
    defaults = {**_WEBHOOK_DEFAULTS, **(_MUTATING_DEFAULTS if kind == "mutating" else {})}
    for key, value in defaults.items():
        if out.get(key) is None:
            out[key] = copy.deepcopy(value)
    client = dict(out.get("clientConfig") or {})
    client.pop("caBundle", None)
    service = client.get("service")
    if isinstance(service, dict) and service.get("port") is None:
        client["service"] = {**service, "port": 443}
    out["clientConfig"] = client
    rules = out.get("rules")
    if isinstance(rules, list):
        out["rules"] = [{**r, "scope": r.get("scope") or "*"} if isinstance(r, dict) else r for r in rules]
    for key in [k for k, v in out.items() if v in ([], None) and k not in _WEBHOOK_DEFAULTS]:
        del out[key]
    return out


def drift(live: Sequence[Mapping[str, Any]], desired: Sequence[Mapping[str, Any]], kind: str) -> list[str]:
    """What differs between the live webhooks and the desired ones, one short line each.

    live: the `webhooks` list of the live configuration; desired: the chart's list for `kind`.
    Lines name the webhook and the fields that differ, e.g. "rbac.dra-guard.io: matchConditions
    differ", "extra webhook x.example.com", "missing webhook rbac.dra-guard.io", "webhooks out of
    order". An empty list means the configuration is as the chart rendered it (caBundle aside).
    """
    want = {str(w.get("name")): normalized(w, kind) for w in desired}
    have = {str(w.get("name")): normalized(w, kind) for w in live}
    out = [f"missing webhook {name}" for name in want if name not in have]
    out += [f"extra webhook {name}" for name in have if name not in want]
    for name in want:
        if name in have and have[name] != want[name]:
            fields = sorted(k for k in set(want[name]) | set(have[name]) if want[name].get(k) != have[name].get(k))
            out.append(f"{name}: {', '.join(fields)} differ")
    if not out and list(have) != list(want):
        out.append("webhooks out of order")
    return out


def restored(desired: Sequence[Mapping[str, Any]], ca_bundle: bytes) -> list[dict[str, Any]]:
    """The desired webhooks with clientConfig.caBundle set to `ca_bundle` (PEM bytes), ready to
    replace the live configuration's `webhooks` list."""
    value = base64.b64encode(ca_bundle).decode()
    out = []
    for hook in desired:
        new = copy.deepcopy(dict(hook))
        new["clientConfig"] = {**(new.get("clientConfig") or {}), "caBundle": value}
        out.append(new)
    return out
