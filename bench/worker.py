"""One benchmark task in a fresh Python process, so that the memory it measures is its own.

The child is ``python -m bench.run --worker JOB``: ``bench/run.py`` sets the process up as the app does and runs
the task named in the job; its last stdout line is the task's JSON answer.
"""
from __future__ import annotations

import json
import subprocess
import sys

from bench import ROOT


def worker(job: dict) -> dict:
    """Run one task in a fresh Python process (so its memory is its own) and return its JSON answer."""
    completed = subprocess.run([sys.executable, "-m", "bench.run", "--worker", json.dumps(job)], cwd=ROOT,
                               capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"bench worker {job} failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])
