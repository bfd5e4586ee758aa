"""Benchmarks: our capture and views side by side with the plain forward (``python -m bench.run``)."""
