"""Forward hooks that act for the thread that registered them only.

A loaded model is cached and shared by every browser session, and a hook registered on one of its modules fires for
every thread's forward while it is registered. Head ablation and activation patching hold theirs for seconds; without
this, another session's prompt run in that time came out with heads switched off or activations patched in.
"""
from __future__ import annotations

import functools
import threading


def this_thread_only(hook):
    """``hook`` wrapped to return None (change nothing) when called from any thread but the current one."""
    owner = threading.get_ident()

    @functools.wraps(hook)
    def guarded(*args, **kwargs):
        if threading.get_ident() != owner:
            return None
        return hook(*args, **kwargs)

    return guarded
