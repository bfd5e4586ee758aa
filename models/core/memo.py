"""What ``models/`` remembers: values computed once per live object (a model, a tokenizer) and dropped with it.

The app's caches of derived results live in ``app/resources.py``; a memo here belongs to an object's lifetime
(named sites of a model, a tokenizer's special tokens), so it can never outlive the object or hand one object's
value to another that took its memory address.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class PerObject(Generic[T]):
    """``get(owner, compute)``: ``compute()`` once per live ``owner`` (and per ``key``), kept until the owner is
    garbage-collected. Thread-safe; two threads asking at once may both compute (the values are equal), one is
    kept. Keyed by identity, so owners need not be hashable or comparable."""

    def __init__(self):
        self._values: dict[tuple, T] = {}
        self._watched: set[int] = set()
        self._lock = threading.Lock()

    def get(self, owner: object, compute: Callable[[], T], key: object = None) -> T:
        entry = (id(owner), key)
        with self._lock:
            if entry in self._values:
                return self._values[entry]
        value = compute()
        with self._lock:
            if id(owner) not in self._watched:
                weakref.finalize(owner, self._forget, id(owner))  # TypeError for an object without weak refs
                self._watched.add(id(owner))
            return self._values.setdefault(entry, value)

    def _forget(self, owner_id: int) -> None:
        with self._lock:
            self._watched.discard(owner_id)
            for entry in [entry for entry in self._values if entry[0] == owner_id]:
                del self._values[entry]

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)
