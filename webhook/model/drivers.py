"""Recognising a DRA driver DaemonSet (pure; read by the probes and eviction policies and the ClaimIndex).

Sources: "Good practices for DRA as a Cluster Admin" ("Deploy and maintain DRA drivers": a driver
is usually a DaemonSet talking to the kubelet through the kubeletplugin interface), the
kubeletplugin helper (k8s.io/dynamic-resource-allocation/kubeletplugin: registration socket in
/var/lib/kubelet/plugins_registry, DRA socket in /var/lib/kubelet/plugins/<driver>), and the
dra-example-driver and NVIDIA GPU driver charts (CDI specs in /var/run/cdi).

Order of evidence, first match wins:
1. the DaemonSet's label or annotation ``dra-guard.io/driver: <driver name>``;
2. a configured selector (namespace + DaemonSet labels);
3. auto-detection (can be switched off): the pod template mounts hostPath
   /var/lib/kubelet/plugins_registry **and** /var/lib/kubelet/plugins (or a subfolder) **and** shows
   a DRA-specific sign: a /var/run/cdi mount, or a ServiceAccount that may write ResourceSlices.
   A CSI node plugin mounts the same kubelet folders but shows neither sign, so it is left alone.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from webhook.config import DetectionConfig
from webhook.model.readers import as_list as _list
from webhook.model.readers import as_map as _map
from webhook.model.readers import as_str as _str

DRIVER_KEY = "dra-guard.io/driver"
CONTAINERS_ANNOTATION = "dra-guard.io/plugin-containers"
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
CDI_DIRS = ("/var/run/cdi", "/run/cdi")

_DRIVER_FLAG = re.compile(r"^--?driver-name(?:=(.*))?$")


@dataclasses.dataclass(frozen=True)
class Driver:
    """A DaemonSet recognised as a DRA driver.

    name: the driver name (e.g. gpu.example.com), "" when it cannot be told.
    evidence: how it was recognised (for messages), e.g. "annotation dra-guard.io/driver".
    plugin_containers: indexes into spec.template.spec.containers of the kubelet plugin containers.
    """

    name: str
    evidence: str
    plugin_containers: tuple[int, ...]


def pod_spec(daemonset: Mapping[str, Any]) -> Mapping[str, Any]:
    """spec.template.spec of a DaemonSet dict ({} when missing)."""
    return _map(_map(_map(daemonset.get("spec")).get("template")).get("spec"))


def host_paths(spec: Mapping[str, Any]) -> dict[str, str]:
    """Volume name -> hostPath path (trailing '/' removed) of a PodSpec dict."""
    out = {}
    for vol in _list(spec.get("volumes")):
        vol = _map(vol)
        path = _str(_map(vol.get("hostPath")).get("path")).rstrip("/")
        if path and _str(vol.get("name")):
            out[vol["name"]] = path
    return out


def _mounted_paths(container: Mapping[str, Any], volumes: Mapping[str, str]) -> set[str]:
    return {volumes[m["name"]] for m in map(_map, _list(container.get("volumeMounts")))
            if _str(m.get("name")) in volumes}


def _in_plugins_dir(path: str) -> bool:
    return path == PLUGINS_DIR or path.startswith(PLUGINS_DIR + "/")


def name_from_container(container: Mapping[str, Any]) -> str:
    """The driver name a container states: --driver-name=X / --driver-name X, or env DRIVER_NAME."""
    words = [w for w in _list(container.get("command")) + _list(container.get("args")) if isinstance(w, str)]
    for i, word in enumerate(words):
        m = _DRIVER_FLAG.match(word)
        if m:
            if m.group(1):
                return m.group(1)
            if i + 1 < len(words):
                return words[i + 1]
    for env in map(_map, _list(container.get("env"))):
        if env.get("name") == "DRIVER_NAME" and _str(env.get("value")):
            return _str(env.get("value"))
    return ""


def _name_from_paths(paths: set[str]) -> str:
    for path in sorted(paths):
        if path.startswith(PLUGINS_DIR + "/"):
            return path[len(PLUGINS_DIR) + 1:].split("/")[0]
    return ""


def plugin_containers(daemonset: Mapping[str, Any]) -> tuple[int, ...]:
    """Indexes of the kubelet plugin containers: those named in annotation dra-guard.io/plugin-containers
    ("a,b"), else those mounting the registration folder."""
    spec = pod_spec(daemonset)
    containers = [_map(c) for c in _list(spec.get("containers"))]
    named = _str(_map(_map(daemonset.get("metadata")).get("annotations")).get(CONTAINERS_ANNOTATION))
    if named:
        wanted = {n.strip() for n in named.split(",") if n.strip()}
        return tuple(i for i, c in enumerate(containers) if isinstance(c.get("name"), str) and c["name"] in wanted)
    volumes = host_paths(spec)
    return tuple(i for i, c in enumerate(containers) if REGISTRY_DIR in _mounted_paths(c, volumes))


def _driver_name(daemonset: Mapping[str, Any], containers: tuple[int, ...]) -> str:
    spec = pod_spec(daemonset)
    all_containers = [_map(c) for c in _list(spec.get("containers"))]
    for i in containers or range(len(all_containers)):
        name = name_from_container(all_containers[i])
        if name:
            return name
    return _name_from_paths(set(host_paths(spec).values()))


def detect(daemonset: Mapping[str, Any], *, config: DetectionConfig,
           can_write_slices: Callable[[str, str], bool] = lambda ns, sa: False) -> Driver | None:
    """Whether an apps/v1 DaemonSet dict is a DRA driver, and which; None when it is not.

    can_write_slices(namespace, serviceAccountName) tells whether RBAC lets that ServiceAccount
    write ResourceSlices (from the RBAC cache); it is a DRA sign for auto-detection.
    """
    meta = _map(daemonset.get("metadata"))
    labels, annotations = _map(meta.get("labels")), _map(meta.get("annotations"))
    containers = plugin_containers(daemonset)
    explicit = _str(annotations.get(DRIVER_KEY)) or _str(labels.get(DRIVER_KEY))
    if explicit:
        return Driver(name=explicit, evidence=f"{DRIVER_KEY}={explicit}", plugin_containers=containers)
    namespace = _str(meta.get("namespace"))
    for sel in config.selectors:
        if sel.namespace == namespace and all(labels.get(k) == v for k, v in sel.match_labels.items()):
            return Driver(name=sel.driver_name or _driver_name(daemonset, containers),
                          evidence=f"selector in namespace {sel.namespace}", plugin_containers=containers)
    if not config.auto_detect:
        return None
    spec = pod_spec(daemonset)
    paths = set(host_paths(spec).values())
    if REGISTRY_DIR not in paths or not any(_in_plugins_dir(p) for p in paths):
        return None
    if any(p in CDI_DIRS for p in paths):
        sign = "mounts /var/run/cdi"
    else:
        sa = _str(spec.get("serviceAccountName")) or _str(spec.get("serviceAccount")) or "default"
        if not can_write_slices(namespace, sa):
            return None  # a CSI node plugin, most likely
        sign = f"ServiceAccount {namespace}/{sa} may write ResourceSlices"
    return Driver(name=_driver_name(daemonset, containers),
                  evidence=f"kubelet plugin mounts and {sign}", plugin_containers=containers)
