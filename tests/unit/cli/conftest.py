"""Unit tests of webhook/cli/ (the dra-guard subcommands' parsing, terminal output and exit codes,
drain and suggest-values), run in-process or as `python -m webhook.cli`.

This folder mirrors the package it tests (tests/unit/<package>/, docs/contributing.md): no control
plane and no dra-guard server over the network here (tests/e2e, tests/http do that); fixtures shared
by this folder's modules belong in this file."""
