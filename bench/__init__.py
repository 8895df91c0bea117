"""Benchmarks: ``python -m bench.<name> [--quick]`` prints figures beside a same-run baseline."""
