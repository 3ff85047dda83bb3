"""Unit tests of webhook/config/ (loading, the JSON schema, subjects, exceptions: a bad key stops
start-up naming it).

This folder mirrors the package it tests (tests/unit/<package>/, docs/contributing.md): no control
plane and no dra-guard server over the network here (tests/e2e, tests/http do that); fixtures shared
by this folder's modules belong in this file."""
