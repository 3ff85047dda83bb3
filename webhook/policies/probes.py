"""Driver liveness probes: give every DRA driver's kubelet plugin container a gRPC liveness probe.

Source: "Good practices for DRA as a Cluster Admin", section "Ensure your DRA driver exposes a
liveness probe and utilize it": drivers may serve the gRPC health protocol (grpc.health.v1.Health);
use it as the DaemonSet's liveness probe so a hung driver is restarted. dra-example-driver and the
NVIDIA GPU driver serve it on --healthcheck-port / HEALTHCHECK_PORT (51515) for service "liveness";
probe shape as in their charts (core/v1 Probe with a GRPCAction). Also "Prefer DRA drivers that
support seamless upgrade": a driver that supports it (POD_UID from metadata.uid, kubelet >= 1.33)
needs updateStrategy.rollingUpdate maxSurge 1 / maxUnavailable 0; one that does not must keep
maxSurge 0.

Rules: never touch a container that has a livenessProbe of any handler type (a container has at
most one handler); add a probe only where the health port is known (a probe on a port the driver
does not serve would crash-loop it); patch with `add` only, idempotently; on UPDATE, do not start a
rollout of every driver pod on our own: when the pod template is otherwise unchanged, warn instead.
A health port of 0 or below (annotation, --healthcheck-port, HEALTHCHECK_PORT) means "no health
service" (the NVIDIA and Intel charts document it): no probe, even with assumeDefaultPort; an
advisory finding says so. So does a driver known to switch its health service off by leaving the
port out (webhook.model.health: the SR-IOV DRA driver). assumeDefaultPort is global, or per
drivers.selectors entry (the first selector matching the DaemonSet; unset: the global value).
By default a startupProbe on the same gRPC endpoint comes with the liveness probe
(probes.startupProbe: 10 s x 30 = 5 min): device discovery on a real node can take minutes, and
NVIDIA replaced its liveness-only probe for that reason; a container's own startupProbe is never
touched.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from webhook.config import Config, DetectionConfig, ProbeConfig
from webhook.model import drivers as drivers_mod
from webhook.model import health
from webhook.model.facts import Facts
from webhook.model.readers import as_list as _list
from webhook.model.readers import as_map as _map
from webhook.policies.decision import ALLOW, Decision, Finding, short

POLICY = "probes"
OPT_OUT = "dra-guard.io/probes"
PORT_ANNOTATION = "dra-guard.io/healthcheck-port"
ADDED_PREFIX = "probes.dra-guard.io/"  # + container name: "grpc:<port>" for every probe dra-guard added
PORT_NAMES = ("healthcheck", "health", "grpc-health")
_PORT_FLAG = re.compile(r"^--?healthcheck-port(?:=(.*))?$")
UNSET = " unset"  # health_port's source suffix for a driver whose health service is off without the setting


def _port(value: Any) -> int | None:
    """A health port value: 1..65535, 0 for "no health service" (0 or below, as two driver projects
    document it), None when it is no number or above 65535."""
    try:
        port = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return None if port > 65535 else max(port, 0)


def health_port(
    container: Mapping[str, Any], *, annotation: str, config: ProbeConfig, assume: bool | None = None
) -> tuple[int | None, str]:
    """(port, where it came from) of a container's gRPC health service, (None, "") when unknown;
    port 0 when a source says "no health service" (a value of 0 or below, or "<ENV> unset" for a
    driver that is off without it): then no probe is added, even with assumeDefaultPort.

    Order: the DaemonSet annotation dra-guard.io/healthcheck-port ("51515", or per container
    "plugin=51515,gpus=51516"), a containerPort named healthcheck/health/grpc-health, a
    --healthcheck-port argument or HEALTHCHECK_PORT env of the container, a driver known to be off
    without them (webhook.model.health), and only with assumeDefaultPort (`assume`, None: the
    configured one) the configured default.
    """
    found = (
        _annotated_port(annotation, container.get("name"))
        or _named_port(container)
        or _flag_port(container)
        or _env_port(container)
    )
    if found is not None:
        return found
    off = health.off_by_omission(container)
    if off is not None:
        return 0, off[1] + UNSET
    if config.assume_default_port if assume is None else assume:
        return config.default_port, "probes.defaultPort"
    return None, ""


def _annotated_port(annotation: str, name: Any) -> tuple[int, str] | None:
    """The port the DaemonSet's annotation gives container `name`: "51515" for every container, or
    "plugin=51515,gpus=51516" per container (a container it does not name: None)."""
    source = f"annotation {PORT_ANNOTATION}"
    if "=" in annotation:
        for part in annotation.split(","):
            key, _, value = part.partition("=")
            port = _port(value)
            if key.strip() == name and port is not None:
                return port, source
        return None
    port = _port(annotation) if annotation else None
    return None if port is None else (port, source)


def _named_port(container: Mapping[str, Any]) -> tuple[int, str] | None:
    """A containerPort named healthcheck, health or grpc-health (1..65535; 0 counts as unnamed)."""
    for p in map(_map, _list(container.get("ports"))):
        port = _port(p.get("containerPort"))
        if p.get("name") in PORT_NAMES and port:
            return port, f"containerPort {p.get('name')}"
    return None


def _flag_port(container: Mapping[str, Any]) -> tuple[int, str] | None:
    """The container's --healthcheck-port (or -healthcheck-port) argument, "=PORT" or the next word."""
    words = [w for w in _list(container.get("command")) + _list(container.get("args")) if isinstance(w, str)]
    for i, word in enumerate(words):
        m = _PORT_FLAG.match(word)
        if m:
            value = m.group(1) if m.group(1) is not None else (words[i + 1] if i + 1 < len(words) else "")
            port = _port(value)
            if port is not None:
                return port, "--healthcheck-port"
    return None


def _env_port(container: Mapping[str, Any]) -> tuple[int, str] | None:
    """The container's HEALTHCHECK_PORT environment variable (a literal value; valueFrom is not read)."""
    for env in map(_map, _list(container.get("env"))):
        port = _port(env.get("value")) if env.get("name") == "HEALTHCHECK_PORT" else None
        if port is not None:
            return port, "HEALTHCHECK_PORT"
    return None


def assume_default_port(daemonset: Mapping[str, Any], *, detection: DetectionConfig, config: ProbeConfig) -> bool:
    """assumeDefaultPort for a DaemonSet dict: its drivers.selectors entry's when set, else probes'."""
    selector = drivers_mod.matching_selector(daemonset, detection)
    if selector is not None and selector.assume_default_port is not None:
        return selector.assume_default_port
    return config.assume_default_port


def grpc_probe(port: int, config: ProbeConfig, *, startup: bool = False) -> dict[str, Any]:
    """A core/v1 Probe dict with a gRPC handler on `port` for the configured service."""
    if startup:
        return {
            "grpc": {"port": port, "service": config.service},
            "periodSeconds": config.startup_period_seconds,
            "failureThreshold": config.startup_failure_threshold,
        }
    return {
        "grpc": {"port": port, "service": config.service},
        "periodSeconds": config.period_seconds,
        "timeoutSeconds": config.timeout_seconds,
        "failureThreshold": config.failure_threshold,
    }


def _ref(daemonset: Mapping[str, Any]) -> tuple[str, str]:
    meta = _map(daemonset.get("metadata"))
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _finding(
    daemonset: Mapping[str, Any], check: str, message: str, summary: str, *, fixed_by_patch: bool = False, **details: Any
) -> Finding:
    ns, name = _ref(daemonset)
    return Finding(
        policy=POLICY,
        kind="DaemonSet",
        namespace=ns,
        name=name,
        message=message,
        summary=short(summary),
        enforced=False,
        check=check,
        fixed_by_patch=fixed_by_patch,
        details=details,
    )


def _surge(strategy: Mapping[str, Any]) -> int | None:
    """maxSurge of a RollingUpdate DaemonSet strategy as a number (percent counts as > 0), None for OnDelete."""
    if strategy.get("type") == "OnDelete":
        return None
    value = _map(strategy.get("rollingUpdate")).get("maxSurge", 0)
    text = str(value).strip().rstrip("%")
    try:
        return int(text)
    except ValueError:
        return 0


def supports_seamless_upgrade(daemonset: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet's pods get POD_UID from metadata.uid (kubeletplugin.RollingUpdate drivers)."""
    return _supports_seamless_upgrade(drivers_mod.pod_spec(daemonset))


def _supports_seamless_upgrade(spec: Mapping[str, Any]) -> bool:
    for c in map(_map, _list(spec.get("containers"))):
        for env in map(_map, _list(c.get("env"))):
            field = _map(_map(env.get("valueFrom")).get("fieldRef")).get("fieldPath")
            if env.get("name") == "POD_UID" and field == "metadata.uid":
                return True
    return False


def upgrade_findings(daemonset: Mapping[str, Any]) -> list[Finding]:
    """Advisory findings about the DaemonSet's updateStrategy and seamless-upgrade support."""
    spec = drivers_mod.pod_spec(daemonset)
    surge = _surge(_map(_map(daemonset.get("spec")).get("updateStrategy")))
    if surge is None:
        return []
    ns, name = _ref(daemonset)
    if _supports_seamless_upgrade(spec) and surge == 0:
        return [
            _finding(
                daemonset,
                "seamless-upgrade",
                f"DaemonSet {ns}/{name} runs a DRA driver that supports seamless upgrade (POD_UID from "
                f"metadata.uid) but its updateStrategy has maxSurge 0, so every upgrade leaves a gap in which "
                f"pods cannot start and claims cannot be cleaned up. Set updateStrategy.rollingUpdate "
                f"maxSurge: 1, maxUnavailable: 0.",
                f"dra-guard: DaemonSet {name} supports seamless upgrade: set maxSurge: 1, maxUnavailable: 0",
            )
        ]
    if not _supports_seamless_upgrade(spec) and surge > 0:
        return [
            _finding(
                daemonset,
                "seamless-upgrade",
                f"DaemonSet {ns}/{name} runs a DRA driver without seamless-upgrade support (no POD_UID from "
                f"metadata.uid) but its updateStrategy has maxSurge > 0: two driver pods on one node will "
                f"fight over one kubelet plugin socket. Set maxSurge: 0, or use a driver version that "
                f"supports seamless upgrade (kubelet >= 1.33).",
                f"dra-guard: DaemonSet {name}: maxSurge > 0 without seamless upgrade; two driver pods will fight over one socket",
            )
        ]
    return []


def _copy_for_patch(daemonset: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the DaemonSet that shares every subtree except the ones evaluate() changes
    (metadata, annotations, spec, template, pod spec, containers): no deep copy of arbitrary input."""
    out = dict(daemonset)
    if isinstance(daemonset.get("metadata"), Mapping):
        out["metadata"] = dict(daemonset["metadata"])
    spec = out["spec"] = dict(_map(daemonset.get("spec")))
    template = spec["template"] = dict(_map(spec.get("template")))
    pod = template["spec"] = dict(_map(template.get("spec")))
    if isinstance(pod.get("containers"), list):
        pod["containers"] = [dict(c) if isinstance(c, Mapping) else c for c in pod["containers"]]
    return out


def _patch(daemonset: Mapping[str, Any], modified: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """JSON Patch (RFC 6902 dicts) from `daemonset` to `modified`, a _copy_for_patch() copy.

    evaluate() only sets keys of the metadata's annotations (or adds the annotations) and of the
    pod template's containers, so only those maps are compared, one level deep (_shallow_ops):
    each key added, replaced or removed with its whole value, the operations jsonpatch.make_patch
    finds for such a change at a fraction of its cost (its recursive diff was most of the policy's
    CPU per review: bench/RESULTS.md).
    """
    ops: list[dict[str, Any]] = []
    old_meta, new_meta = daemonset.get("metadata"), modified.get("metadata")
    if isinstance(old_meta, Mapping) and isinstance(new_meta, Mapping) and old_meta is not new_meta:
        old_notes, new_notes = old_meta.get("annotations"), new_meta.get("annotations")
        if isinstance(old_notes, Mapping) and isinstance(new_notes, Mapping):
            ops += _shallow_ops(old_notes, new_notes, "/metadata/annotations")
            old_meta, new_meta = {**old_meta, "annotations": None}, {**new_meta, "annotations": None}
        ops += _shallow_ops(old_meta, new_meta, "/metadata")
    old_containers = _map(_map(_map(daemonset.get("spec")).get("template")).get("spec")).get("containers")
    new_containers = modified["spec"]["template"]["spec"].get("containers")
    if isinstance(old_containers, list) and isinstance(new_containers, list) and len(old_containers) == len(new_containers):
        for i, (old_c, new_c) in enumerate(zip(old_containers, new_containers, strict=True)):
            if isinstance(old_c, Mapping) and isinstance(new_c, Mapping):
                ops += _shallow_ops(old_c, new_c, f"/spec/template/spec/containers/{i}")
    return tuple(ops)


def _shallow_ops(old: Mapping[str, Any], new: Mapping[str, Any], at: str) -> list[dict[str, Any]]:
    """RFC 6902 operations turning map `old` into map `new`, both at JSON Pointer `at`, one level
    deep: a remove per key only in `old`, an add per key only in `new`, a replace (whole value) per
    key whose value differs. Keys are escaped as RFC 6901 says (~ as ~0, / as ~1)."""
    ops: list[dict[str, Any]] = [{"op": "remove", "path": f"{at}/{_pointer_part(k)}"} for k in old if k not in new]
    for key, value in new.items():
        if key not in old:
            ops.append({"op": "add", "path": f"{at}/{_pointer_part(key)}", "value": value})
        elif old[key] is not value and old[key] != value:
            ops.append({"op": "replace", "path": f"{at}/{_pointer_part(key)}", "value": value})
    return ops


def _pointer_part(key: str) -> str:
    """A map key as one reference token of a JSON Pointer (RFC 6901 section 3)."""
    return key.replace("~", "~0").replace("/", "~1")


def container_name(container: Mapping[str, Any], index: int) -> str:
    """A container's name for messages and annotation keys ("#<index>" when it has no string name)."""
    name = container.get("name")
    return name if isinstance(name, str) and name else f"#{index}"


def evaluate(
    daemonset: Mapping[str, Any], *, driver: drivers_mod.Driver, config: ProbeConfig, assume: bool | None = None
) -> tuple[dict[str, Any], list[Finding]]:
    """The DaemonSet with probes added (a modified copy) and the findings about it; `assume`:
    assumeDefaultPort for it (None: probes.assumeDefaultPort)."""
    modified = _copy_for_patch(daemonset)
    annotation = str(_annotations(daemonset).get(PORT_ANNOTATION) or "")
    containers = _list(modified["spec"]["template"]["spec"].get("containers"))
    findings: list[Finding] = []
    added: dict[str, str] = {}  # container name -> "grpc:<port>"
    for i in driver.plugin_containers:
        container = containers[i]
        if not isinstance(container, dict) or "livenessProbe" in container:
            continue  # a probe of the container's own, of any handler type, is never touched
        cname = container_name(container, i)
        port, source = health_port(container, annotation=annotation, config=config, assume=assume)
        if port is None:
            findings.append(_port_unknown(daemonset, driver, cname))
        elif port == 0:
            findings.append(_health_off(daemonset, driver, cname, _why_off(container, source), source))
        else:
            startup = _add_probes(container, port, config)
            added[cname] = f"grpc:{port}"
            findings.append(_probe_added(daemonset, driver, cname, port, source, config, startup=startup))
    _record_added(daemonset, modified, added)
    return modified, findings + upgrade_findings(daemonset)


def _annotations(daemonset: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(_map(daemonset.get("metadata")).get("annotations"))


def _add_probes(container: dict[str, Any], port: int, config: ProbeConfig) -> bool:
    """Give `container` (a copy's) the gRPC livenessProbe on `port` and, when configured and it has
    none, the startupProbe on the same endpoint; returns whether the startupProbe was added."""
    container["livenessProbe"] = grpc_probe(port, config)
    startup = config.startup_probe and "startupProbe" not in container
    if startup:
        container["startupProbe"] = grpc_probe(port, config, startup=True)
    return startup


def _record_added(daemonset: Mapping[str, Any], modified: dict[str, Any], added: Mapping[str, str]) -> None:
    """Annotate `modified` with probes.dra-guard.io/<container>: grpc:<port> for each probe added."""
    metadata = daemonset.get("metadata")
    if not added or not isinstance(metadata, Mapping) or not isinstance(metadata.get("annotations", {}), Mapping):
        return  # odd metadata (not a map, annotations null) is left alone rather than replaced
    # one key per container: a container added later gets a new key (an `add`), nothing is replaced
    annotations_in = _annotations(daemonset)
    modified["metadata"]["annotations"] = {
        **annotations_in,
        **{ADDED_PREFIX + c: v for c, v in added.items() if ADDED_PREFIX + c not in annotations_in},
    }


def _why_off(container: Mapping[str, Any], source: str) -> str:
    """Why a health port of 0 means no health service: the setting's value, or a driver that runs
    none without the setting (webhook.model.health)."""
    off = health.off_by_omission(container) if source.endswith(UNSET) else None
    if off:
        return f"{source}: {off[0]} runs no health service without it, so probes.assumeDefaultPort is never applied to it"
    return f"{source} is 0 or below"


def _port_unknown(daemonset: Mapping[str, Any], driver: drivers_mod.Driver, cname: str) -> Finding:
    ns, name = _ref(daemonset)
    return _finding(
        daemonset,
        "no-healthcheck-port",
        f"DaemonSet {ns}/{name} container {cname} is a DRA driver ({driver.evidence}) without a livenessProbe, "
        f"and dra-guard cannot tell its gRPC health port, so a hung driver will not be restarted. Declare the "
        f'port: annotation {PORT_ANNOTATION}: "<port>", a containerPort named healthcheck, or '
        f"--healthcheck-port=<port>; or add a livenessProbe yourself.",
        f"dra-guard: driver container {cname} has no livenessProbe and no known health port; see {PORT_ANNOTATION}",
        container=cname,
    )


def _health_off(daemonset: Mapping[str, Any], driver: drivers_mod.Driver, cname: str, why: str, source: str) -> Finding:
    ns, name = _ref(daemonset)
    return _finding(
        daemonset,
        "healthcheck-disabled",
        f"DaemonSet {ns}/{name} container {cname} is a DRA driver ({driver.evidence}) whose health service "
        f"is switched off ({why}), so dra-guard adds no probe and a hung driver will not "
        f"be restarted. Give it a health port to have a gRPC liveness probe added.",
        f"dra-guard: driver container {cname} has its health service off ({source}); no probe added",
        container=cname,
    )


def _probe_added(
    daemonset: Mapping[str, Any],
    driver: drivers_mod.Driver,
    cname: str,
    port: int,
    source: str,
    config: ProbeConfig,
    *,
    startup: bool,
) -> Finding:
    ns, name = _ref(daemonset)
    budget = config.startup_period_seconds * config.startup_failure_threshold
    return _finding(
        daemonset,
        "missing-liveness-probe",
        f"DaemonSet {ns}/{name} container {cname} is a DRA driver ({driver.evidence}) without a livenessProbe; "
        f"dra-guard adds grpc port {port} service {config.service} (port from {source})"
        + (f", after a startupProbe on the same endpoint ({budget} s budget)" if startup else "")
        + ".",
        f"dra-guard would add a gRPC livenessProbe (port {port}) to driver container {cname}",
        fixed_by_patch=True,
        container=cname,
        port=port,
    )


def review(
    request: Mapping[str, Any],
    *,
    detection: DetectionConfig,
    config: ProbeConfig,
    can_write_slices: Callable[[str, str], bool] = lambda ns, sa: False,
) -> Decision:
    """Judge one AdmissionReview request for an apps/v1 DaemonSet (CREATE or UPDATE).

    Returns a Decision whose patch adds the missing probes (only `add` operations), with advisory
    findings for drivers whose health port is unknown and for their update strategy.
    """
    operation = request.get("operation")
    obj = request.get("object")
    if operation not in ("CREATE", "UPDATE") or not isinstance(obj, Mapping):
        return ALLOW
    if str(_map(_map(obj.get("metadata")).get("annotations")).get(OPT_OUT, "")).lower() == "off":
        return ALLOW
    driver = drivers_mod.detect(obj, config=detection, can_write_slices=can_write_slices)
    if driver is None:
        return ALLOW
    modified, findings = evaluate(
        obj, driver=driver, config=config, assume=assume_default_port(obj, detection=detection, config=config)
    )
    old = request.get("oldObject")
    if (
        operation == "UPDATE"
        and isinstance(old, Mapping)
        and _map(_map(old.get("spec")).get("template")) == _map(_map(obj.get("spec")).get("template"))
    ):
        # adding a probe now would change the pod template and roll every driver pod on every node
        return Decision(findings=tuple(_deferred(f) if f.check == "missing-liveness-probe" else f for f in findings))
    patch = _patch(obj, modified)
    if any(op["op"] != "add" for op in patch):
        # a malformed object whose shape the copy could not keep: patch nothing rather than replace
        findings = [dataclasses.replace(f, fixed_by_patch=False) for f in findings]
        return Decision(findings=tuple(findings))
    return Decision(findings=tuple(findings), patch=patch)


def _deferred(finding: Finding) -> Finding:
    """A missing-liveness-probe finding reworded for an UPDATE that leaves the pod template alone:
    the probe comes with the next change of the template, nothing is patched now."""
    return dataclasses.replace(
        finding,
        fixed_by_patch=False,
        message=finding.message.replace("dra-guard adds", "dra-guard will add it at the next change of the pod template,"),
        summary=short(
            f"dra-guard: driver container {finding.details.get('container')} has no livenessProbe; "
            f"added at the next pod template change"
        ),
    )


def audit(
    daemonset: Mapping[str, Any],
    *,
    detection: DetectionConfig,
    config: ProbeConfig,
    can_write_slices: Callable[[str, str], bool] = lambda ns, sa: False,
) -> list[Finding]:
    """Findings for one existing DaemonSet dict: driver containers without a liveness probe, and
    update-strategy findings. Empty for DaemonSets that are not DRA drivers or opted out."""
    if str(_map(_map(daemonset.get("metadata")).get("annotations")).get(OPT_OUT, "")).lower() == "off":
        return []
    driver = drivers_mod.detect(daemonset, config=detection, can_write_slices=can_write_slices)
    if driver is None:
        return []
    return evaluate(
        daemonset, driver=driver, config=config, assume=assume_default_port(daemonset, detection=detection, config=config)
    )[1]


def admit(request: Mapping[str, Any], facts: Facts, config: Config) -> Decision:
    """review() with the configured detection and probe settings; RBAC from Facts tells which
    ServiceAccounts may write ResourceSlices. (The registry's `review`.)"""
    return review(request, detection=config.detection, config=config.probes, can_write_slices=facts.service_account_writes_slices)


def audit_objects(facts: Facts, config: Config, objects: Mapping[str, list[dict[str, Any]]]) -> Iterator[Finding]:
    """audit() of every DaemonSet among `objects` (kind -> object dicts). (The registry's `audit`.)"""
    for daemonset in objects.get("DaemonSet", []):
        yield from audit(
            daemonset, detection=config.detection, config=config.probes, can_write_slices=facts.service_account_writes_slices
        )
