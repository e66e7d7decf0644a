"""Benchmarks that print ratios measured in one run; run as modules: python -m bench.NAME."""
