"""Benchmarks of dra-guard (issue 9): not part of CI."""
