"""Reading manifests for `dra-guard audit`: files, folders and standard input (`-f -`), every
problem collected instead of stopping at the first one.

YAML is parsed with libyaml's compiled loader (yaml.CSafeLoader) when PyYAML was built with it,
else the pure-Python SafeLoader: the same documents, about ten times faster on large files.
Objects are kept as the apiserver stores them: `metadata.namespace` on a cluster-scoped kind
(CLUSTER_SCOPED: a ClusterRole, a ClusterRoleBinding...), which the apiserver ignores and vendor
manifests carry, is dropped, so such an object is indexed and found like the stored one.
A document without `kind` (a values.yaml, a CI file) is skipped with a note; a Helm template
(`{{ ... }}` that is not valid YAML) is skipped with "render it with `helm template` first"; unreadable files and
invalid YAML are input problems (exit code 2), reported together with the findings of everything
that could be read.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import sys
import time
from collections.abc import Callable, Iterable
from typing import IO, Any

import yaml

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"
#: yaml.CSafeLoader (libyaml) when available, else yaml.SafeLoader
LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TEMPLATE = re.compile(r"\{\{.*?\}\}", re.S)
#: the built-in cluster-scoped kinds, by API group (`kubectl api-resources --namespaced=false`)
CLUSTER_SCOPED: dict[str, frozenset[str]] = {
    "": frozenset({"Namespace", "Node", "PersistentVolume", "ComponentStatus"}),
    "rbac.authorization.k8s.io": frozenset({"ClusterRole", "ClusterRoleBinding"}),
    "resource.k8s.io": frozenset({"DeviceClass", "ResourceSlice", "DeviceTaintRule"}),
    "admissionregistration.k8s.io": frozenset(
        {
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
        }
    ),
    "apiextensions.k8s.io": frozenset({"CustomResourceDefinition"}),
    "apiregistration.k8s.io": frozenset({"APIService"}),
    "storage.k8s.io": frozenset({"StorageClass", "CSIDriver", "CSINode", "VolumeAttachment", "VolumeAttributesClass"}),
    "scheduling.k8s.io": frozenset({"PriorityClass"}),
    "node.k8s.io": frozenset({"RuntimeClass"}),
    "certificates.k8s.io": frozenset({"CertificateSigningRequest", "ClusterTrustBundle"}),
    "networking.k8s.io": frozenset({"IngressClass", "IPAddress", "ServiceCIDR"}),
    "flowcontrol.apiserver.k8s.io": frozenset({"FlowSchema", "PriorityLevelConfiguration"}),
}
_ANY_CLUSTER_SCOPED = frozenset().union(*CLUSTER_SCOPED.values())


class InputError(ValueError):
    """A manifest could not be read or parsed; the message names the file (and line)."""


@dataclasses.dataclass
class Manifests:
    """What was read: objects (dicts with `kind`), where each came from (`sources`: (kind,
    namespace, name) -> "path:line"), input problems (each an error line naming the file), notes
    (skipped documents), and how many files and bytes were read."""

    objects: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sources: dict[tuple[str, str, str], str] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    files: int = 0
    bytes: int = 0


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name) of an object dict ("" for what is missing)."""
    raw = obj.get("metadata")
    meta: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return str(obj.get("kind") or ""), str(meta.get("namespace") or ""), str(meta.get("name") or "")


def cluster_scoped(obj: dict[str, Any]) -> bool:
    """Whether an object dict is of a built-in cluster-scoped kind (CLUSTER_SCOPED): its kind in the
    group of its apiVersion, or, without an apiVersion, in any group."""
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    if not isinstance(api_version, str) or not api_version:
        return kind in _ANY_CLUSTER_SCOPED
    group = api_version.rpartition("/")[0]
    return kind in CLUSTER_SCOPED.get(group, ())


def as_stored(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` without metadata.namespace when its kind is cluster-scoped (the apiserver ignores it
    there), else `obj` itself."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "namespace" in meta and cluster_scoped(obj):
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "namespace"}}
    return obj


def _files(paths: Iterable[str], out: Manifests) -> list[str]:
    found: list[str] = []
    for raw in paths:
        if raw == STDIN:
            found.append(STDIN)
            continue
        path = pathlib.Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in MANIFEST_SUFFIXES)
            if not files:
                out.problems.append(f"{path}: folder holds no .yaml, .yml or .json file")
            found.extend(str(p) for p in files)
        elif path.is_file():
            found.append(str(path))
        else:
            out.problems.append(f"{path}: no such file or folder")
    return found


def _document_lines(text: str) -> list[int]:
    """1-based line of each YAML document's start (a line '---' starts a new one)."""
    starts = [1]
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("---") and (line == "---" or line[3] in " \t#"):
            if number > 1 or starts != [1]:
                starts.append(number + 1)
    return starts


def _expand(doc: Any, *, where: str, out: Manifests) -> list[dict[str, Any]]:
    if doc is None:
        return []
    if not isinstance(doc, dict):
        out.notes.append(f"{where}: skipped: not a Kubernetes object (a {type(doc).__name__})")
        return []
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        return [obj for item in doc["items"] for obj in _expand(item, where=where, out=out)]
    if not isinstance(kind, str) or not kind:
        out.notes.append(f"{where}: skipped: no kind (not a Kubernetes object)")
        return []
    return [doc]


#: what an input that is not UTF-8 text is called (manifests are YAML or JSON, both UTF-8 here)
NOT_TEXT = "not UTF-8 text (a binary file?)"


def read_text(source: str, text: str, out: Manifests) -> None:
    """Parse one file's (or stdin's) text into `out`."""
    out.files += 1
    out.bytes += len(text)
    try:
        docs = list(yaml.load_all(text, Loader=LOADER))
    except UnicodeEncodeError:
        # binary bytes on stdin arrive as lone surrogates (Python reads stdin with
        # surrogateescape), which the C parser cannot encode back to UTF-8
        out.problems.append(f"{source}: cannot read: {NOT_TEXT}")
        return
    except RecursionError:
        out.problems.append(f"{source}: invalid YAML: nested too deeply")
        return
    except yaml.YAMLError as exc:
        if _TEMPLATE.search(text):
            out.notes.append(
                f"{source}: skipped: a Helm template ({{{{ ... }}}}); render it with `helm template` "
                f"first, e.g. helm template CHART | dra-guard audit -f -"
            )
            return
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark is not None else ""
        out.problems.append(f"{source}{at}: invalid YAML: {getattr(exc, 'problem', None) or exc}")
        return
    lines = _document_lines(text)
    for i, doc in enumerate(docs, 1):
        where = f"{source} document {i}"
        line = lines[i - 1] if i - 1 < len(lines) else 1
        for obj in map(as_stored, _expand(doc, where=where, out=out)):
            out.objects.append(obj)
            out.sources.setdefault(object_key(obj), f"{source}:{line}")


def read(
    paths: Iterable[str],
    *,
    stdin: IO[str] | None = None,
    progress: Callable[[str], None] | None = None,
    progress_seconds: float = 2.0,
) -> Manifests:
    """Read manifests from files, folders (.yaml, .yml, .json, recursively) and "-" (standard
    input, once). Never raises for bad input: problems and notes are collected in the result.
    progress(line) is called at most every `progress_seconds` seconds while reading (for long audits)."""
    out = Manifests()
    started = last = time.monotonic()
    stdin_read = False
    for source in _files(paths, out):
        if source == STDIN:
            if stdin_read:
                continue
            stdin_read = True
            read_text("<stdin>", (stdin or sys.stdin).read(), out)
        else:
            try:
                content = pathlib.Path(source).read_text()
            except UnicodeDecodeError:
                out.problems.append(f"{source}: cannot read: {NOT_TEXT}")
                continue
            except OSError as exc:
                out.problems.append(f"{source}: cannot read: {exc.strerror or exc}")
                continue
            read_text(source, content, out)
        now = time.monotonic()
        if progress is not None and now - last >= progress_seconds:
            last = now
            progress(f"read {out.files} file(s), {out.bytes / 1e6:.1f} MB, {len(out.objects)} object(s) in {now - started:.0f} s")
    return out


def load_manifests(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Every object of `paths` (see read()); raises InputError naming the first problem, for
    callers that want all-or-nothing."""
    result = read(paths)
    if result.problems:
        raise InputError(result.problems[0])
    return result.objects
