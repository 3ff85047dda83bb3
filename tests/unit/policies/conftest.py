"""Unit tests of webhook/policies/ (the RBAC guard, the eviction guard, the probe patches, admin
access, declared drivers, the real charts and drivers of the catalogues): pure rules over facts
built with tests/builders.py.

This folder mirrors the package it tests (tests/unit/<package>/, docs/contributing.md): no control
plane and no dra-guard server over the network here (tests/e2e, tests/http do that); fixtures shared
by this folder's modules belong in this file."""
