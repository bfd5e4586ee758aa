"""models/core/memo.py: what models/ remembers lives as long as the object it is about, and no longer."""
from __future__ import annotations

import gc

from models.core import memo


class Owner:
    pass


def test_a_value_is_computed_once_per_live_owner_and_dropped_with_it():
    remembered = memo.PerObject()
    calls = []
    first, second = Owner(), Owner()
    assert remembered.get(first, lambda: calls.append(1) or "a") == "a"
    assert remembered.get(first, lambda: calls.append(1) or "b") == "a"  # computed once
    assert remembered.get(second, lambda: "c") == "c"
    assert remembered.get(first, lambda: "d", key=2) == "d"  # another key of the same owner
    assert len(calls) == 1 and len(remembered) == 3
    del first
    gc.collect()
    assert len(remembered) == 1  # both of first's values went with it
    again = Owner()  # may take first's address: it never sees first's values
    assert remembered.get(again, lambda: "new") == "new"
