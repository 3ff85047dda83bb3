"""Unit tests of the certs package and certificates.mode self (files on disk, reloading, the reconciler
over an in-memory CertApi); the real Kubernetes calls are tested in tests/e2e/test_certificates.py.

This folder mirrors the package it tests (tests/unit/<package>/, docs/contributing.md): no control
plane and no dra-guard server over the network here (tests/e2e, tests/http do that); fixtures shared
by this folder's modules belong in this file."""
