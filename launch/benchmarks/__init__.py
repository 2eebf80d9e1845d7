"""Benchmark suites for launch/bench.py, one module per suite."""
