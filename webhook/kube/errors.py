"""ClusterError, importable without loading the `kubernetes` package (the CLI's error handling)."""
from __future__ import annotations


class ClusterError(RuntimeError):
    """The Kubernetes API could not be configured or reached; the message says why."""
