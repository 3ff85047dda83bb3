"""A kubeconfig context that does not exist is one line naming the contexts there are (the client
library's own error says the file is invalid)."""

from __future__ import annotations

import pytest
import yaml

from webhook.kube.client import api_client
from webhook.kube.errors import ClusterError


def kubeconfig(tmp_path, *contexts: str):
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": name, "context": {"cluster": "c", "user": "u"}} for name in contexts],
        "current-context": contexts[0],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_context_not_in_the_kubeconfig_names_the_ones_there_are(tmp_path):
    path = kubeconfig(tmp_path, "dev", "production")
    with pytest.raises(ClusterError) as caught:
        api_client(str(path), timeout_seconds=5, context="prod")
    message = str(caught.value)
    assert message == f"no context 'prod' in {path} (its contexts: dev, production); did you mean production?"
    assert "Invalid kube-config" not in message


def test_an_existing_context_is_used(tmp_path):
    path = kubeconfig(tmp_path, "dev", "production")
    client = api_client(str(path), timeout_seconds=5, context="production")
    assert client.configuration.host == "https://127.0.0.1:6443"


def test_the_context_is_looked_up_in_kubeconfig_from_the_environment(tmp_path, monkeypatch):
    path = kubeconfig(tmp_path, "dev")
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(ClusterError, match=r"no context 'staging' in .* \(its contexts: dev\)$"):
        api_client(None, timeout_seconds=5, context="staging")
