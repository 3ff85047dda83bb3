"""Unit tests of webhook/audit/ (the cluster audit's findings and their formats: text, JSON,
PolicyReport and OpenReports, the exceptions' skips) and the audit's control-plane checks.

This folder mirrors the package it tests (tests/unit/<package>/, docs/contributing.md): no control
plane and no dra-guard server over the network here (tests/e2e, tests/http do that); fixtures shared
by this folder's modules belong in this file."""
