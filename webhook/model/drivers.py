"""Recognising a DRA driver DaemonSet (pure; read by the probes and eviction policies and the ClaimIndex).

Sources: "Good practices for DRA as a Cluster Admin" ("Deploy and maintain DRA drivers": a driver
is usually a DaemonSet talking to the kubelet through the kubeletplugin interface), the
kubeletplugin helper (registration socket in <kubelet root>/plugins_registry, DRA socket in
<kubelet root>/plugins/<driver>), and the public driver charts (dra-example-driver, NVIDIA GPU +
ComputeDomain, Intel GPU, DRA CPU, DRA network driver: CDI specs in /var/run/cdi; some mount the
whole plugins folder and name their driver nowhere in the spec; one DaemonSet can run two drivers).

Order of evidence, first match wins:
1. the DaemonSet's label or annotation ``dra-guard.io/driver: <name>[,<name>...]``; it earns
   eviction protection only when the DaemonSet's ServiceAccount may write ResourceSlices or a
   configured selector matches (a tenant must not shield pods by labelling a DaemonSet);
2. a configured selector (namespace + DaemonSet labels, driverName(s));
3. auto-detection (can be switched off): either the pod template mounts a kubelet plugin
   registration folder (``<root>/plugins_registry`` for a configured or any root, or a root
   itself) **and** the plugins folder (``<root>/plugins`` or below, or the root) **and** shows a
   /var/run/cdi mount; or the DaemonSet's ServiceAccount may write ResourceSlices (enough alone).
   A CSI node plugin mounts the same kubelet folders but shows neither sign, so it is left alone.

Names, per plugin container: every ``--driver-name`` argument and ``DRIVER_NAME`` /
``DRIVER_NAMES`` environment variable (comma-separated lists allowed), else a mounted
``<root>/plugins/<name>`` folder. A DaemonSet with a plugin container whose names cannot be told
is ``complete=False``: the ClaimIndex then attributes it the node's drivers (from ResourceSlices)
that no other driver pod on the node accounts for.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.config import DetectionConfig, DriverSelector
from webhook.model.readers import as_list as _list
from webhook.model.readers import as_map as _map
from webhook.model.readers import as_str as _str

DRIVER_KEY = "dra-guard.io/driver"
CONTAINERS_ANNOTATION = "dra-guard.io/plugin-containers"
REGISTRY = "plugins_registry"
CDI_DIRS = ("/var/run/cdi", "/run/cdi")
NAME_ENVS = ("DRIVER_NAME", "DRIVER_NAMES")
#: the evidence of a DaemonSet the admin named in drivers.declared
DECLARED = "declared in drivers.declared"

_DRIVER_FLAG = re.compile(r"^--?driver-names?(?:=(.*))?$")


@dataclasses.dataclass(frozen=True)
class Driver:
    """A DaemonSet recognised as a DRA driver.

    names: the driver names its spec, label or selector gives (e.g. ("gpu.nvidia.com",
    "compute-domain.nvidia.com")), possibly empty. learned: parallel to names, how each was learned.
    complete: every plugin container's names are known (False: the rest comes from ResourceSlices).
    protects: its identity is trusted for eviction protection.
    evidence: how it was recognised (for messages), e.g. "selector in namespace gpu".
    plugin_containers: indexes into spec.template.spec.containers of the kubelet plugin containers.
    """

    names: tuple[str, ...]
    evidence: str
    plugin_containers: tuple[int, ...]
    learned: tuple[str, ...] = ()
    complete: bool = True
    protects: bool = True

    @property
    def name(self) -> str:
        """The names joined with "," ("" when none is known), for messages."""
        return ",".join(self.names)


def split_names(value: str) -> list[str]:
    """A comma-separated list of driver names, stripped, empty entries dropped."""
    return [n.strip() for n in value.split(",") if n.strip()]


def pod_spec(daemonset: Mapping[str, Any]) -> Mapping[str, Any]:
    """spec.template.spec of a DaemonSet dict ({} when missing)."""
    return _map(_map(_map(daemonset.get("spec")).get("template")).get("spec"))


def host_paths(spec: Mapping[str, Any]) -> dict[str, str]:
    """Volume name -> hostPath path (normalised, trailing '/' removed) of a PodSpec dict."""
    out = {}
    for vol in _list(spec.get("volumes")):
        vol = _map(vol)
        path = _str(_map(vol.get("hostPath")).get("path"))
        if path and _str(vol.get("name")):
            out[vol["name"]] = posixpath.normpath(path)
    return out


def _mounted_paths(container: Mapping[str, Any], volumes: Mapping[str, str]) -> set[str]:
    return {volumes[m["name"]] for m in map(_map, _list(container.get("volumeMounts"))) if _str(m.get("name")) in volumes}


def kubelet_roots(paths: set[str], config: DetectionConfig) -> set[str]:
    """The configured kubelet root directories, plus the parent of any mounted plugins_registry folder."""
    roots = {posixpath.normpath(r) for r in config.kubelet_root_dirs if r}
    return roots | {posixpath.dirname(p) for p in paths if posixpath.basename(p) == REGISTRY}


def is_registration(path: str, roots: set[str]) -> bool:
    """Whether a hostPath holds the kubelet's plugin registration sockets (<root>/plugins_registry or a root)."""
    return posixpath.basename(path) == REGISTRY or path in roots


def is_plugins(path: str, roots: set[str]) -> bool:
    """Whether a hostPath is a kubelet root, its plugins folder, or a folder below it."""
    return any(path == r or path == r + "/plugins" or path.startswith(r + "/plugins/") for r in roots)


def names_from_container(container: Mapping[str, Any]) -> list[str]:
    """The driver names a container states: every --driver-name=X / --driver-name X argument and
    DRIVER_NAME / DRIVER_NAMES env value, each possibly a comma-separated list."""
    words = [w for w in _list(container.get("command")) + _list(container.get("args")) if isinstance(w, str)]
    found: list[str] = []
    for i, word in enumerate(words):
        m = _DRIVER_FLAG.match(word)
        if m:
            found += split_names(m.group(1) if m.group(1) is not None else (words[i + 1] if i + 1 < len(words) else ""))
    for env in map(_map, _list(container.get("env"))):
        if env.get("name") in NAME_ENVS:
            found += split_names(_str(env.get("value")))
    return list(dict.fromkeys(found))


def name_from_container(container: Mapping[str, Any]) -> str:
    """The first driver name a container states ("" when none): see names_from_container."""
    names = names_from_container(container)
    return names[0] if names else ""


def _names_from_paths(paths: set[str], roots: set[str]) -> list[str]:
    out = []
    for path in sorted(paths):
        for root in roots:
            if path.startswith(root + "/plugins/"):
                out.append(path[len(root) + len("/plugins/") :].split("/")[0])
    return list(dict.fromkeys(out))


#: a pod spec's hostPath volumes (host_paths) and the kubelet roots they imply (kubelet_roots)
Mounts = tuple[dict[str, str], set[str]]


def mounts_of(spec: Mapping[str, Any], config: DetectionConfig | None = None) -> Mounts:
    """(host_paths(spec), kubelet_roots of them) of a PodSpec dict: computed once per detect()."""
    volumes = host_paths(spec)
    return volumes, kubelet_roots(set(volumes.values()), config or DetectionConfig())


def plugin_containers(
    daemonset: Mapping[str, Any], config: DetectionConfig | None = None, *, mounts: Mounts | None = None
) -> tuple[int, ...]:
    """Indexes of the kubelet plugin containers: those named in annotation dra-guard.io/plugin-containers
    ("a,b"), else those mounting a registration folder, else those mounting the plugins folder.
    mounts: mounts_of() the DaemonSet's pod spec, when known already."""
    spec = pod_spec(daemonset)
    containers = [_map(c) for c in _list(spec.get("containers"))]
    named = _str(_map(_map(daemonset.get("metadata")).get("annotations")).get(CONTAINERS_ANNOTATION))
    if named:
        wanted = set(split_names(named))
        return tuple(i for i, c in enumerate(containers) if isinstance(c.get("name"), str) and c["name"] in wanted)
    volumes, roots = mounts or mounts_of(spec, config)
    mounted = [_mounted_paths(c, volumes) for c in containers]
    registering = tuple(i for i, paths in enumerate(mounted) if any(is_registration(p, roots) for p in paths))
    return registering or tuple(i for i, paths in enumerate(mounted) if any(is_plugins(p, roots) for p in paths))


def spec_names(
    daemonset: Mapping[str, Any],
    containers: tuple[int, ...],
    config: DetectionConfig | None = None,
    *,
    mounts: Mounts | None = None,
) -> tuple[list[tuple[str, str]], bool]:
    """([(name, how learned)], complete) from the pod template: per plugin container its arguments
    and environment, else a <root>/plugins/<name> folder it mounts; complete when every plugin
    container (every container when none is one) gave a name. mounts: as plugin_containers."""
    spec = pod_spec(daemonset)
    volumes, roots = mounts or mounts_of(spec, config)
    all_containers = [_map(c) for c in _list(spec.get("containers"))]
    found: dict[str, str] = {}
    complete = True
    for i in containers or range(len(all_containers)):
        c = all_containers[i]
        cname = _str(c.get("name")) or f"#{i}"
        names = [(n, f"container {cname} --driver-name/DRIVER_NAME") for n in names_from_container(c)]
        names = names or [
            (n, f"container {cname} mounts plugins/{n}") for n in _names_from_paths(_mounted_paths(c, volumes), roots)
        ]
        if not names:
            complete = False
        for n, how in names:
            found.setdefault(n, how)
    if not found:
        path_names = _names_from_paths(set(volumes.values()), roots)
        found = {n: f"mounts plugins/{n}" for n in path_names}
        complete = bool(path_names) and len(all_containers) <= 1
    return list(found.items()), complete and bool(found)


def _make(
    names: list[tuple[str, str]], complete: bool, evidence: str, containers: tuple[int, ...], protects: bool = True
) -> Driver:
    return Driver(
        names=tuple(n for n, _ in names),
        learned=tuple(h for _, h in names),
        complete=complete,
        evidence=evidence,
        plugin_containers=containers,
        protects=protects,
    )


def matching_selector(daemonset: Mapping[str, Any], config: DetectionConfig) -> DriverSelector | None:
    """The first drivers.selectors entry whose namespace is the DaemonSet dict's and whose
    matchLabels its labels include, or None."""
    meta = _map(daemonset.get("metadata"))
    namespace, labels = _str(meta.get("namespace")), _map(meta.get("labels"))
    return next(
        (s for s in config.selectors if s.namespace == namespace and all(labels.get(k) == v for k, v in s.match_labels.items())),
        None,
    )


def detect(
    daemonset: Mapping[str, Any], *, config: DetectionConfig, can_write_slices: Callable[[str, str], bool] = lambda ns, sa: False
) -> Driver | None:
    """Whether an apps/v1 DaemonSet dict is a DRA driver, and which; None when it is not.

    can_write_slices(namespace, serviceAccountName) tells whether RBAC lets that ServiceAccount
    write ResourceSlices (from the RBAC cache): a driver sign enough on its own, and what makes a
    dra-guard.io/driver label trusted.
    """
    meta = _map(daemonset.get("metadata"))
    labels, annotations = _map(meta.get("labels")), _map(meta.get("annotations"))
    spec = pod_spec(daemonset)
    mounts = mounts_of(spec, config)
    containers = plugin_containers(daemonset, config, mounts=mounts)
    namespace = _str(meta.get("namespace"))
    sa = _str(spec.get("serviceAccountName")) or _str(spec.get("serviceAccount")) or "default"
    writes = can_write_slices(namespace, sa)
    selector = matching_selector(daemonset, config)
    explicit = split_names(_str(annotations.get(DRIVER_KEY)) or _str(labels.get(DRIVER_KEY)))
    label_names = [(n, f"label/annotation {DRIVER_KEY}") for n in explicit]
    declared = config.is_declared(namespace, _str(meta.get("name")))
    if explicit and (selector is not None or writes or declared):
        trust = (
            f"selector in namespace {namespace}"
            if selector is not None
            else f"ServiceAccount {namespace}/{sa} may write ResourceSlices"
            if writes
            else DECLARED
        )
        return _make(label_names, True, f"{DRIVER_KEY}={','.join(explicit)}, trusted: {trust}", containers)
    if selector is not None:
        names = [(n, f"selector in namespace {namespace}") for n in selector.names]
        complete = True
        if not names:
            names, complete = spec_names(daemonset, containers, config, mounts=mounts)
        return _make(names, complete, f"selector in namespace {namespace}", containers)
    if declared:
        names, complete = spec_names(daemonset, containers, config, mounts=mounts)
        return _make(names, complete, DECLARED, containers)
    if config.auto_detect:
        paths = set(mounts[0].values())
        roots = mounts[1]
        mounted = any(is_registration(p, roots) for p in paths) and any(is_plugins(p, roots) for p in paths)
        sign = ""
        if writes:
            sign = f"ServiceAccount {namespace}/{sa} may write ResourceSlices"
        elif mounted and any(p in CDI_DIRS for p in paths):
            sign = "kubelet plugin mounts and /var/run/cdi"
        if sign:
            names, complete = (label_names, True) if label_names else spec_names(daemonset, containers, config, mounts=mounts)
            return _make(names, complete, sign, containers)
    if explicit:
        return _make(
            label_names,
            True,
            f"{DRIVER_KEY}={','.join(explicit)} (not trusted for eviction protection: "
            f"its ServiceAccount may not write ResourceSlices and no selector matches)",
            containers,
            protects=False,
        )
    return None


def undeclared(
    found: Iterable[tuple[str, str, Driver | None]], detection: DetectionConfig, *, guard_namespace: str
) -> list[tuple[str, str]]:
    """The (namespace, name) of recognised DRA driver DaemonSets missing from drivers.declared,
    sorted. found: (namespace, name, detect()'s verdict) of DaemonSets. A driver whose identity is
    not trusted (Driver.protects False) and dra-guard's own namespace are left out."""
    return sorted(
        (ns, name)
        for ns, name, driver in found
        if driver is not None and driver.protects and ns != guard_namespace and not detection.is_declared(ns, name)
    )
