"""Corpus runs in the model's own dtype: a bfloat16 model (2.5× faster matmuls on a CPU with AVX512-BF16/AMX, see
bench/case_corpus.py) gives the float32 eager maps' statistics within a stated tolerance, and a results folder
never mixes precisions."""
from __future__ import annotations

import numpy as np
import pytest

from models.corpus import engine, statistics
from models.corpus.store import ResultStore
from tests.test_corpus import TEXTS, corpus_of, tiny_lm  # noqa: F401  (the fixture)

# bfloat16 keeps 8 bits of mantissa: weights (probabilities) within 0.03, entropy within 0.1 bit, distance within
# 0.3 token of float32 on this tiny model (SmolLM2 on the bundled corpus: bench/RESULTS.md)
TOLERANCE = {"entropy_bits": 0.1, "mean_distance": 0.3}


@pytest.fixture(scope="module")
def bf16_lm(tiny_lm):  # noqa: F811
    from models import families

    loaded, eager = tiny_lm
    return families.get("causal_lm").load(loaded.spec, "cpu", "bfloat16"), eager


def test_bfloat16_statistics_are_the_float32_eager_ones_within_the_tolerance(bf16_lm):
    import torch

    loaded, eager = bf16_lm
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    results, skipped = statistics.StatisticsRunner(loaded, max_tokens=64).run(corpus_of(TEXTS).documents)
    assert not skipped
    worst = {}
    for item in results:
        reference = statistics.eager_statistics(eager, item.token_ids)  # float32
        for name in statistics.STATISTICS:
            found, expected = item.statistics[name], reference[name]
            assert np.array_equal(np.isnan(found), np.isnan(expected)), name
            difference = np.nan_to_num(np.abs(found - expected))
            worst[name] = max(worst.get(name, 0.0), float(difference.max()))
            assert difference.max() <= TOLERANCE.get(name, 0.03), f"{item.doc_id} {name}"
    assert any(value > 1e-5 for value in worst.values())  # it did run in bfloat16, not float32


def test_a_results_folder_refuses_a_resume_in_another_precision(bf16_lm, tiny_lm, tmp_path):  # noqa: F811
    loaded32, _ = tiny_lm
    loaded16, _ = bf16_lm
    corpus = corpus_of(TEXTS[:2])
    store = engine.run_corpus(corpus, loaded16, tmp_path, max_tokens=64)
    assert store.info.dtype == "bfloat16" and ResultStore.open(tmp_path).info.dtype == "bfloat16"
    with pytest.raises(ValueError, match="bfloat16.*float32"):
        engine.run_corpus(corpus, loaded32, tmp_path, max_tokens=64)
