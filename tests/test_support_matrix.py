"""The support matrix in CI (tests/support_matrix.py): a tiny random model of every attention architecture in
transformers' auto mappings for each page, typed into the page as a user would, against eager attention.

Fails when any architecture is drawn wrong or crashes, when one that was exact stops being exact (the expectations
in tests/data/support_matrix.json, written with docs/MODELS.md by ``python -m tests.support_matrix --write``), when
a refusal shows a library's insides instead of words, and when the coverage falls below what issue 36 asks.
"""
from __future__ import annotations

import json

import pytest

from tests import support_matrix

DRAWN = ("exact", "exact (eager path)")


@pytest.fixture(scope="module")
def outcomes():
    return support_matrix.run_all(log=lambda line: None)


def test_no_architecture_is_drawn_wrong_or_crashes(outcomes):
    failed = [f"{o.page}:{o.model_type}: {o.status}: {o.message.splitlines()[0] if o.message else ''}"
              [:300] for o in outcomes if o.status in support_matrix.FAILED]
    assert not failed, "\n".join(failed)


def test_what_was_exact_stays_exact(outcomes):
    expected = json.loads(support_matrix.EXPECTED.read_text())
    found = {f"{o.page}:{o.model_type}": o for o in outcomes}
    lost = [f"{key}: was {status}, now {found[key].status}: {found[key].message[:200]}"
            for key, status in expected.items()
            if status in DRAWN and key in found and found[key].status not in DRAWN]
    assert not lost, "\n".join(lost)


def test_refusals_are_in_words(outcomes):
    leaking = [f"{o.page}:{o.model_type}: {o.message[:300]}" for o in outcomes if o.status == "refused"
               and any(marker in o.message for marker in support_matrix.NOT_WORDS)]
    assert not leaking, "\n".join(leaking)


def test_coverage_is_what_the_issue_asks(outcomes):
    counts = support_matrix.summary(outcomes)
    assert counts["covered"] >= 120, counts
    assert counts["drawn_share"] >= 0.9, counts
