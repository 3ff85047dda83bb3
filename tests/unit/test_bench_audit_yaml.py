"""bench/audit_yaml.py's pure parts, on a small file (the 5 MB run is in bench/RESULTS.md)."""

from __future__ import annotations

from bench import audit_yaml


def test_manifest_has_about_the_size_asked_and_every_object_is_read():
    text = audit_yaml.manifest(0.1)
    assert 50_000 < len(text) < 200_000
    result = audit_yaml.measure(0.1, 1)
    assert result["bytes"] == len(text) and result["objects"] == text.count("\nkind: ") + text.startswith("kind: ")
    assert result["parse_seconds"] > 0 and result["ratio"] > 0
