"""Unit tests of webhook/serve/ in process (the Flask app, the event-loop front's kernel and HTTP/1
parts, budgets and lanes, the audit child, the periodic audit, fuzzing of the endpoints); the real
server over TLS is tested in tests/http.

This folder mirrors the package it tests (tests/unit/<package>/, docs/contributing.md): no control
plane and no dra-guard server over the network here (tests/e2e, tests/http do that); fixtures shared
by this folder's modules belong in this file."""
