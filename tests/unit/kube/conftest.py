"""Unit tests of webhook/kube/ (the API client's errors and contexts, paged lists, RBAC drift, the
shared eviction records) over fakes of the API: no cluster.

This folder mirrors the package it tests (tests/unit/<package>/, docs/contributing.md): no control
plane and no dra-guard server over the network here (tests/e2e, tests/http do that); fixtures shared
by this folder's modules belong in this file."""
