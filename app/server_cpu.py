"""Keep the server's CPU for the pages' own work. Profiling the real server under load (``py-spy`` on
``python -m bench.case_load``, see bench/RESULTS.md) found three costs per view on top of a GPT view's own ~0.2 s of
script work, together more than the work itself:

- Streamlit's file watcher: each new session resolved the path of every module in ``sys.modules`` (thousands, with
  PyTorch and transformers) and polled the app's files. Off in .streamlit/config.toml (``fileWatcherType``).
- A full garbage collection after every script run (Streamlit's ``runner.postScriptGC``): 0.3 s of CPU holding the
  GIL, walking ~550,000 objects (modules, classes, the models' parameters) that live as long as the server.
  ``freeze_heap()`` moves what is alive into the collector's permanent generation (``gc.freeze``), which later
  collections skip; it runs once the heavy imports are done (app/warmup.py) and after each model load
  (app/resources.py). The per-run collection keeps its purpose, at about a hundredth of the cost. A frozen object
  is still freed when its last reference goes; only a reference cycle among frozen objects would stay, and those
  are import-time and model objects, which live until the server stops anyway.
- OpenMP threads spinning: PyTorch's intra-op threads busy-wait at the end of every parallel region for their
  partner, which on a machine with more runnable threads than cores is often not running: a 28-token SmolLM2
  forward cost 0.25-0.30 s of CPU with four sessions at once, 0.20 s with ``OMP_WAIT_POLICY=PASSIVE``
  (``quiet_openmp``, before PyTorch is first imported). A user's own ``OMP_WAIT_POLICY`` is kept.
"""
from __future__ import annotations

import gc
import os
import threading

_lock = threading.Lock()


def quiet_openmp() -> None:
    """Idle OpenMP threads sleep instead of spinning; read when PyTorch's OpenMP starts, so call it before."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def freeze_heap() -> int:
    """Collect what is garbage now, then freeze everything left; the number of frozen objects."""
    with _lock:
        gc.collect()
        gc.freeze()
        return gc.get_freeze_count()
