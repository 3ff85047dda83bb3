"""Benchmarks of dra-guard, run as `python -m bench <subcommand>` (bench/__main__.py); not part of CI."""
