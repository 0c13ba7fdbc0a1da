"""Benchmarks (not tests): `python -m bench <name>`; see bench/README.md."""
