"""Write ``corpus_reference.npz``: the corpus statistics the code gives on fixed documents, kept so that a rewrite
can be checked against them (``tests/test_corpus_exact.py``). The file in the repository was written at commit
c48df04, before the statistics were reduced in the forward; running this on later code writes what that code gives.

    python -m tests.data.corpus_reference tests/data/corpus_reference.npz
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch


def record(path: str) -> None:
    from models import families
    from models.core.specs import ModelSpec
    from models.corpus import analysis, statistics
    from models.corpus.readers import Document, bundled
    from tests.test_corpus import TEXTS
    from tests.tiny_text_models import save_tiny_causal_lm

    torch.set_num_threads(1)
    out = {}

    def put(prefix, results):
        for item in results:
            for name in statistics.STATISTICS:
                out[f"{prefix}/{item.doc_id}/{name}"] = item.statistics[name]
            for name in (*statistics.PEAK_FIELDS, "expert_load", "coactivation", "router_entropy"):
                if getattr(item, name) is not None:
                    out[f"{prefix}/{item.doc_id}/{name}"] = getattr(item, name)
            out[f"{prefix}/{item.doc_id}/token_ids"] = np.asarray(item.token_ids)

    folder = save_tiny_causal_lm(Path(tempfile.mkdtemp()) / "llama")
    spec = ModelSpec("causal_lm", "tiny-llama", "hub", str(folder), "test", "random weights")
    loaded = families.get("causal_lm").load(spec, "cpu", "float32")
    docs = [Document(f"doc#{i}", t, "test") for i, t in enumerate(TEXTS)]
    put("tiny", statistics.StatisticsRunner(loaded, 64).run(docs)[0])
    for a, b in (("sat", "cat"), ("the", "the")):
        ranked, _ = analysis.search_heads(loaded, docs, a, b, max_tokens=64)
        out[f"tiny_search/{a}_{b}"] = ranked.sort_values(["layer", "head"]).share.to_numpy()
    out["tiny_embedding/points"] = analysis.query_key_embedding(loaded, docs, 1, 3, max_tokens=64).points
    for dtype, prefix in (("float32", "smollm2"), ("bfloat16", "smollm2_bf16")):
        smollm2 = families.load(families.default_spec("causal_lm"), "cpu", dtype)
        put(prefix, statistics.StatisticsRunner(smollm2, 256).run(bundled("python-docs").head(12).documents)[0])
    moe = families.load(families.default_spec("moe"))
    texts = ["The old man walked to the harbour.", "def f(x):\n    return x + 1", "3 + 4 = 7",
             "The old man walked to the harbour. The old man walked to the harbour."]
    put("moe", statistics.StatisticsRunner(moe, 64).run([Document(f"m#{i}", t, "t")
                                                          for i, t in enumerate(texts)])[0])
    np.savez_compressed(path, **out)


if __name__ == "__main__":
    record(sys.argv[1])
