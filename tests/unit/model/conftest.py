"""Unit tests of webhook/model/ (the caches and indexes the policies read: claims, drains, surge pairs,
leaving pods) at the sizes of the scalability envelope.

This folder mirrors the package it tests (tests/unit/<package>/, docs/contributing.md): no control
plane and no dra-guard server over the network here (tests/e2e, tests/http do that); fixtures shared
by this folder's modules belong in this file."""
