"""The Ray Data engine (2 actors on a local cluster) gives the numbers of the in-process engine."""
from __future__ import annotations

import numpy as np

from models.corpus import engine, statistics
from models.corpus.readers import Corpus, Document
from models.corpus.store import stacked

import ray  # noqa: E402  (declared in requirements-dev.txt: corpus mode's Ray engine)


def test_ray_engine_equals_local_engine(tmp_path, monkeypatch):
    from models import families
    from models.core.specs import ModelSpec
    from tests.tiny_text_models import save_tiny_causal_lm

    folder = save_tiny_causal_lm(tmp_path / "llama")
    spec = ModelSpec("causal_lm", "tiny-llama", "hub", str(folder), "test", "random weights")
    loaded = families.get("causal_lm").load(spec, "cpu", "float32")
    texts = ["the cat sat on the mat. the cat sat on the mat.", "a quick brown fox", "one two three one two three",
             "def add(a, b):\n    return a + b"] * 4
    corpus = Corpus("t", [Document(f"d{i}", t, "test") for i, t in enumerate(texts)], [])
    local = engine.run_corpus(corpus, loaded, tmp_path / "local", max_tokens=32, batch_documents=4)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(engine.ROOT), "HF_HUB_OFFLINE": "1"}})
    try:
        seen = []
        remote = engine.run_corpus(corpus, loaded, tmp_path / "ray", engine="ray", max_tokens=32,
                                   batch_documents=4, actors=2, progress=seen.append)
    finally:
        ray.shutdown()
    assert seen[-1].done == len(texts)
    a = local.table().sort_values("doc_id").reset_index(drop=True)
    b = remote.table().sort_values("doc_id").reset_index(drop=True)
    assert list(a.doc_id) == list(b.doc_id)
    for name in (*statistics.STATISTICS, "peak_value"):
        np.testing.assert_allclose(stacked(a, name, local.info), stacked(b, name, remote.info), rtol=1e-5,
                                   atol=1e-6, equal_nan=True)
