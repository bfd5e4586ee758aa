"""Benchmarks: our capture and views side by side with the plain forward (``python -m bench.run``)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: app/, models/ and bench/ itself
