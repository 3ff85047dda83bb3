"""Reading a config document: one generic walk over the declared keys (webhook.config.declare).

Every error names the key's dotted path (``probes.periodSeconds: must be between 1 and 3600; got 0``;
an unknown key also the closest known one, by difflib). The walk does not stop at the first error:
a key in error is read as its default and the walk goes on, so one ConfigError carries every error
of the document (ConfigError.problems, in the order of the file's keys), as `config validate` and
start-up report them.
"""

from __future__ import annotations

import datetime
import difflib
import ipaddress
import os
import pathlib
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import yaml

from webhook.config.declare import ConfigError, Entry, Key, class_defaults, entries, instance_values
from webhook.config.exceptions import EXCEPTABLE, MAX_DAYS, NAMESPACED_KINDS, PolicyException, parse_expiry
from webhook.config.subjects import (
    NEVER_PRIVILEGED_GROUP_PREFIXES,
    NEVER_PRIVILEGED_GROUPS,
    NEVER_PRIVILEGED_USERS,
    SubjectSet,
    service_account_entry,
)
from webhook.config.types import DNS_LABEL, DNS_SUBDOMAIN, HEADER_KEYS, Config, RbacConfig

#: dotted key -> why it is no longer a setting: a config that still sets it stops start-up with this
#: (never silently ignored: whoever set it expects something of it)
REMOVED_KEYS = {
    "server.reservedThreads": "evictions have server.threads threads of their own, which RBAC and DaemonSet "
    "reviews never hold (they have as many of their own), so nothing is left to reserve",
}


class _Reader:
    """Walks a mapping, taking typed keys and reporting unknown ones with their dotted path."""

    def __init__(self, data: Any, path: str, errors: list[str]) -> None:
        """`errors`: the document's error lines, shared by every reader of it; a `data` that is not a
        mapping is one of them (and reads as empty)."""
        self.errors = errors
        #: the data was not a mapping (one error for it: its keys are not read)
        self.broken = data is not None and not isinstance(data, Mapping)
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            errors.append(f"{path or '<top level>'}: expected a mapping, got {type(data).__name__}")
            data = {}
        self.data: Mapping[Any, Any] = data
        self.path = path
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def take(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        self.seen.add(name)
        if name not in self.data or self.data[name] is None:
            return default
        value = self.data[name]
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            raise ConfigError(f"{self.key(name)}: expected a number, got a boolean")
        if not isinstance(value, kind):
            want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ConfigError(f"{self.key(name)}: expected {want}, got {type(value).__name__} {value!r}")
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value: str = self.take(name, str, default)
        if value not in choices:
            raise ConfigError(f"{self.key(name)}: must be one of {', '.join(choices)}; got {value!r}")
        return value

    def strings(self, name: str, default: frozenset[str]) -> frozenset[str]:
        value = self.take(name, list, None)
        if value is None:
            return default
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise ConfigError(f"{self.key(name)}[{i}]: expected a non-empty string, got {item!r}")
        return frozenset(value)

    def sub(self, name: str) -> _Reader:
        self.seen.add(name)
        return _Reader(self.data.get(name), self.key(name), self.errors)

    def done(self) -> None:
        """Record every key of the mapping that was not read, each with the closest known key, or
        what became of it when it was a setting once (REMOVED_KEYS)."""
        known = sorted(self.seen)
        for name in sorted(str(k) for k in self.data if k not in self.seen):
            if self.key(name) in REMOVED_KEYS:
                self.errors.append(f"{self.key(name)}: no longer a setting: {REMOVED_KEYS[self.key(name)]}; remove it")
                continue
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            self.errors.append(f"{self.key(name)}: unknown key{hint} (known here: {', '.join(known)})")


def _check_number(path: str, declared: Key, value: int | float) -> None:
    lo, hi = declared.lo, declared.hi
    if declared.lo_exclusive:
        if not (lo is None or lo < value) or not (hi is None or value <= hi):
            raise ConfigError(f"{path}: must be > {lo} and <= {hi}; got {value}")
    elif not (lo is None or lo <= value) or not (hi is None or value <= hi):
        raise ConfigError(f"{path}: must be between {lo} and {hi}; got {value}")


def _check_items(path: str, declared: Key, items: frozenset[str]) -> None:
    for item in sorted(items):
        if declared.pattern and not re.search(declared.pattern, item):
            raise ConfigError(f"{path}: {item!r} must be {declared.pattern_help}")
        if declared.ip:
            try:
                ipaddress.ip_address(item)
            except ValueError:
                raise ConfigError(f"{path}: {item!r} is not an IP address") from None


def _read_value(entry: Entry, r: _Reader, name: str, default: Any, read: Mapping[str, Any], notes: list[str]) -> Any:
    """The value of one declared key `name` of reader `r` (`default` when unset); `read` holds the
    section's keys read so far by key name (for a family's inherited defaults)."""
    declared, path = entry.key, r.key(name)
    if entry.kind == "bool":
        return r.take(name, bool, default)
    if entry.kind in ("int", "number"):
        value = r.take(name, int if entry.kind == "int" else (int, float), default)
        _check_number(path, declared, value)
        return value if entry.kind == "int" else float(value)
    if entry.kind == "str":
        text: str = r.take(name, str, None if declared.required else default)
        if declared.required and not text:
            raise ConfigError(f"{path}: required")
        if len(text) < declared.min_length:
            raise ConfigError(f"{path}: must not be empty")
        if declared.pattern and not re.search(declared.pattern, text):
            raise ConfigError(f"{path}: {text!r} must be {declared.pattern_help}")
        return text
    if entry.kind == "choice":
        if declared.required and r.data.get(name) is None:
            r.seen.add(name)
            raise ConfigError(f"{path}: required (one of {', '.join(entry.choices)})")
        return r.choice(name, entry.choices, default)
    if entry.kind == "time":
        raw = r.take(name, (str, datetime.date), None)
        if raw is None:
            if declared.required:
                raise ConfigError(f"{path}: required (an RFC 3339 date-time such as 2026-12-31T00:00:00Z)")
            return default
        try:
            return parse_expiry(raw)
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if entry.kind in ("strings", "sorted_strings"):
        items = r.strings(name, frozenset(default))
        _check_items(path, declared, items)
        return items if entry.kind == "strings" else tuple(sorted(items))
    if entry.kind == "string_map":
        labels: Mapping[Any, Any] = r.take(name, dict, default)
        for k, v in labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ConfigError(f"{path}: keys and values must be strings; got {k!r}: {v!r}")
        return dict(labels)
    assert entry.section is not None
    cls = entry.section
    if entry.kind == "section":
        return cls(**_read_section(cls, r.sub(name), instance_values(default), notes))
    if entry.kind == "sections":
        return tuple(
            cls(**_read_section(cls, _Reader(raw, f"{path}[{i}]", r.errors), class_defaults(cls), notes))
            for i, raw in enumerate(r.take(name, list, list(default)))
        )
    family = r.sub(name)
    members = {}
    for member in declared.names:
        # a member's default: the enclosing section's value (inherit), the per-name one, else the field's own
        member_defaults = {
            **class_defaults(cls),
            **{
                e.attr: read[e.key.inherit] if e.key.inherit else (e.key.per_name or {})[member]
                for e in entries(cls)
                if e.key.inherit or e.key.per_name is not None
            },
        }
        members[member] = cls(**_read_section(cls, family.sub(member), member_defaults, notes))
    family.done()
    return members


def _subjects(values: dict[str, Any], reader: _Reader, notes: list[str]) -> None:
    # every spelling of a ServiceAccount becomes "ns:name" here, once: SubjectSet and the sets'
    # unions compare these strings
    values["service_accounts"] = frozenset(service_account_entry(e) for e in values["service_accounts"])
    _never_trusted(values, reader, notes)


def _never_trusted(values: Mapping[str, Any], reader: _Reader, notes: list[str]) -> None:
    for g in sorted(values["groups"]):
        if g in NEVER_PRIVILEGED_GROUPS or g.startswith(NEVER_PRIVILEGED_GROUP_PREFIXES):
            notes.append(f"{reader.key('groups')}: {g} stands for many identities and is never trusted")
    for u in sorted(values["users"]):
        if u in NEVER_PRIVILEGED_USERS:
            notes.append(f"{reader.key('users')}: {u} is never trusted")


#: the cluster-scoped resource.k8s.io kinds a driver may be let write (rbac.driverResources), besides
#: any the config lists in adminOnlyResources (a newer apiserver's admin kind)
DRA_ADMIN_KINDS: Final = ("deviceclasses", "devicetaintrules", "resourceslices")


def _rbac(values: dict[str, Any], reader: _Reader, notes: list[str]) -> None:
    """driverResources names DRA resources only (bare, or group-qualified with apiGroup): every
    driver subject may write them wherever they are bound, so a core or other group's resource
    there (pods, leases) would hand that write to every driver in every namespace, unreported.
    Then the extra subject lists are added to theirs."""
    group = values["api_group"]
    known = set(DRA_ADMIN_KINDS) | set(values["admin_only_resources"])
    resources, bad = set(), []
    for entry in sorted(values["driver_resources"]):
        name, _, qualifier = entry.partition(".")
        if qualifier and qualifier != group or name not in known:
            bad.append(entry)
        resources.add(name)
    if bad:
        raise ConfigError(
            f"{reader.key('driverResources')}: {', '.join(bad)} {'is not a DRA resource' if len(bad) == 1 else 'are not DRA resources'} "
            f"of {group} (one of {', '.join(f'{k}.{group}' for k in sorted(known))}); every DRA driver may write "
            f"what is listed here, in every namespace. A driver's own controllers hold namespaced powers through a "
            f"RoleBinding in its namespace; any other grant is admitted one binding at a time by an rbac "
            f"exception (exceptions[])"
        )
    values["driver_resources"] = frozenset(resources)
    values["admin_subjects"] = values["admin_subjects"].union(values["extra_admin_subjects"])
    values["driver_subjects"] = values["driver_subjects"].union(values["extra_driver_subjects"])


def _exception(values: dict[str, Any], reader: _Reader, notes: list[str]) -> None:
    """The cross-checks of one exceptions[] entry (webhook.config.exceptions says why each)."""
    policy, kind = values["policy"], values["kind"]
    if policy not in EXCEPTABLE:
        raise ConfigError(
            f"{reader.key('policy')}: the {policy} policy is never excepted (an exception would let "
            f"anyone allowed to evict pods drain a DRA driver its claims still need); one of "
            f"{', '.join(EXCEPTABLE)}"
        )
    kinds = EXCEPTABLE[policy][0]
    if kind not in kinds:
        raise ConfigError(f"{reader.key('kind')}: a {policy} exception names a {' or '.join(kinds)}; got {kind}")
    namespace = values["namespace"]
    if kind in NAMESPACED_KINDS and not namespace:
        raise ConfigError(f"{reader.key('namespace')}: required for a {kind}")
    if kind not in NAMESPACED_KINDS and namespace:
        raise ConfigError(f"{reader.key('namespace')}: a {kind} has no namespace; drop it")
    if namespace and not re.search(DNS_LABEL, namespace):
        raise ConfigError(f"{reader.key('namespace')}: {namespace!r} must be a namespace name (DNS label)")
    if kind == "DaemonSet" and not re.search(DNS_SUBDOMAIN, values["name"]):
        raise ConfigError(f"{reader.key('name')}: {values['name']!r} must be a DaemonSet name (DNS subdomain)")
    subjects: SubjectSet = values["subjects"]
    pins = {
        "roleRef": values["role_ref"],
        "subjects": subjects.users | subjects.groups | subjects.service_accounts,
        "resources": values["resources"],
    }
    for pin, value in pins.items():
        if policy == "rbac" and not value:
            raise ConfigError(
                f"{reader.key(pin)}: required for an rbac exception: it says exactly what the "
                f"binding may grant, so whoever may write the binding cannot widen it"
            )
        if policy != "rbac" and value:
            raise ConfigError(f"{reader.key(pin)}: only rbac exceptions take {pin}; drop it")
    wild = sorted(e for e in subjects.service_accounts if e.endswith(":*"))
    if wild:
        raise ConfigError(f"{reader.key('subjects')}.serviceAccounts: {wild[0]} is a pattern; name each ServiceAccount")
    never = [n for n in notes if n.startswith(reader.key("subjects"))]
    if never:
        raise ConfigError(f"{never[0]}: an exception cannot give it anything")
    horizon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=MAX_DAYS)
    if values["expires"] > horizon:
        raise ConfigError(
            f"{reader.key('expires')}: {values['expires'].isoformat()} is more than {MAX_DAYS} days "
            f"ahead; exceptions are reviewed at least once a year"
        )


#: per section class, what runs after its keys are read and before unknown keys are reported:
#: (values by attribute, which it may rewrite, the section's reader, the "ignored" notes to append to)
_AFTER: dict[type, Callable[[dict[str, Any], _Reader, list[str]], None]] = {
    SubjectSet: _subjects,
    RbacConfig: _rbac,
    PolicyException: _exception,
}


def _read_section(cls: type[Any], reader: _Reader, defaults: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """The declared keys of section dataclass `cls` read from `reader`, by attribute (`defaults` by
    attribute for unset keys); then the "below" cross-checks, then unknown keys are refused."""
    if reader.broken:
        return {e.attr: defaults.get(e.attr) for e in entries(cls)}
    values: dict[str, Any] = {}
    read: dict[str, Any] = {}
    errors_before = len(reader.errors)
    groups = {
        group: reader.sub(group)
        for group in dict.fromkeys(e.key.name.split(".", 1)[0] for e in entries(cls) if "." in e.key.name)
    }
    for entry in entries(cls):
        r, name = reader, entry.key.name
        if "." in name:
            group, name = name.split(".", 1)
            r = groups[group]
        try:
            value = _read_value(entry, r, name, defaults.get(entry.attr), read, notes)
        except ConfigError as exc:
            # recorded; the default stands in so that the keys after it are still checked
            reader.errors.extend(exc.problems)
            value = defaults.get(entry.attr)
        values[entry.attr] = read[entry.key.name] = value
    for entry in entries(cls):
        if entry.key.below and not read[entry.key.name] < read[entry.key.below]:
            reader.errors.append(f"{reader.key(entry.key.name)}: must be shorter than {reader.key(entry.key.below)}")
    # the cross-checks assume every key of the section is valid: after an error they would judge
    # a default standing in for it (or crash on one that has none)
    if cls in _AFTER and len(reader.errors) == errors_before:
        try:
            _AFTER[cls](values, reader, notes)
        except ConfigError as exc:
            reader.errors.extend(exc.problems)
    for group_reader in groups.values():
        group_reader.done()
    reader.done()
    return values


def from_mapping(data: Any) -> Config:
    """Validate a parsed config document (a dict, or None for all defaults) into a Config.

    Raises ConfigError with every error of the document (ConfigError.problems), each naming its key.
    """
    errors: list[str] = []
    top = _Reader(data, "", errors)
    for header in HEADER_KEYS:
        try:
            top.choice(header.name, header.choices, header.choices[0])
        except ConfigError as exc:
            errors.extend(exc.problems)
    notes: list[str] = []
    values = _read_section(Config, top, instance_values(Config()), notes)
    config = Config(**values, ignored=tuple(notes))
    # dra-guard's own namespace: the chart renders certificates.namespace; else the pod's ($POD_NAMESPACE)
    own = config.certificates.namespace or os.environ.get("POD_NAMESPACE", "")
    for i, declared in enumerate(config.detection.declared):
        if own and declared.namespace == own:
            # its namespace is never sent to dra-guard: nothing dra-guard needs to start may wait on itself
            errors.append(
                f"drivers.declared[{i}].namespace: {own} is dra-guard's own namespace, which is never "
                f"sent to dra-guard; install the driver in a namespace of its own"
            )
    seen: dict[tuple[str, str, str, str], int] = {}
    for i, exception in enumerate(config.exceptions):
        where = (exception.policy, exception.kind, exception.namespace, exception.name)
        if where in seen:
            errors.append(
                f"exceptions[{i}]: {exception.ref} is already excepted by exceptions[{seen[where]}]; "
                f"keep one entry per object and policy"
            )
        seen[where] = i
    if errors:
        raise ConfigError(*errors)
    return config.with_guard(own)


def load_config(path: str | pathlib.Path | None) -> Config:
    """Read and validate a YAML config file; None gives the defaults.

    Raises ConfigError (file unreadable, invalid YAML with its line, or every invalid key, each
    line "PATH: KEY: ...").
    """
    if path is None:
        return from_mapping(None)
    try:
        text = pathlib.Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc
    try:
        return from_mapping(data)
    except ConfigError as exc:
        raise ConfigError(*(f"{path}: {problem}" for problem in exc.problems)) from exc
