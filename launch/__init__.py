"""Entry points: run.py (one experiment), sweep.py (flag sweeps), bench.py, fleet.py."""
