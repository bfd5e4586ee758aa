"""Building a model holds one process-wide lock.

PyTorch's default device is process-global state: ``with torch.device("meta")`` (which transformers'
``from_pretrained`` enters, and so do the size estimates in models/core/memory_fit.py) sets it on entry and puts back
what it saw on exit. Two threads doing that at once (two sessions opening pages together, or a page opened while the
server's warm-up loads the default model) could leave it on "meta" for good, after which every load in the process
failed with "Cannot copy out of meta tensor" (tests/test_loading_concurrency.py: 7 of 16 concurrent loads). Forwards
do not touch it, so running models stays concurrent; only building one waits for another (a hub download included,
which shows its progress meanwhile).
"""
from __future__ import annotations

import threading

LOCK = threading.RLock()  # re-entrant: a family's load builds through loading's helpers, which take it again
