"""DRA drivers known to switch their gRPC health service off by leaving its port setting out.

Source: the SR-IOV DRA driver (k8snetworkplumbingwg/dra-driver-sriov): its chart renders the
HEALTHCHECK_PORT env var only when a health port is configured, and without it the binary's
default means "no health service". For such a driver a missing port is an answer ("off"), not an
unknown: probes.assumeDefaultPort would put a probe on a port nobody serves and crash-loop it.

Keyed by the container image's repository name (its last path segment: any registry or mirror,
tag or digest), since the pod spec names the driver nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from webhook.model.readers import as_str

#: image repository name -> (the driver, for messages; the env var whose absence switches it off)
OFF_BY_OMISSION: Final[Mapping[str, tuple[str, str]]] = {
    "dra-driver-sriov": ("the SR-IOV DRA driver (k8snetworkplumbingwg/dra-driver-sriov)", "HEALTHCHECK_PORT"),
}


def image_name(image: str) -> str:
    """The repository name of an image reference: "ghcr.io/org/dra-driver-sriov:v1@sha256:..." ->
    "dra-driver-sriov"."""
    return image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


def off_by_omission(container: Mapping[str, Any]) -> tuple[str, str] | None:
    """(driver, env var) when a container dict runs a driver of OFF_BY_OMISSION, else None."""
    return OFF_BY_OMISSION.get(image_name(as_str(container.get("image"))))
