"""The corpus statistics' fused kernel (``models/corpus/statistics_triton.py``) gives the PyTorch path's numbers
(``HeadStatistics``, which tests/test_corpus_exact.py holds to eager float64 maps): a causal Llama (GQA, RoPE) and a
BERT encoder (padding masked), padded batches and documents alone, through Triton's interpreter on the CPU (in a
process of its own, as tests/test_tiles.py explains) and compiled on a GPU when there is one."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from models.corpus import statistics, statistics_triton
from models.corpus.readers import Document

TEXTS = ["the cat sat on the mat. the dog sat on the log. the cat sat on the mat.",
         "a quick brown fox jumps over the lazy dog!",
         "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b",
         "one two three four five six seven eight nine ten one two three four",
         "x", "the the the the the the the the"]
TOLERANCE = {torch.float32: (2e-5, 2e-6), torch.bfloat16: (2e-5, 2e-6)}  # (rtol, atol): the same q/k, fp32 sums


def documents() -> list[Document]:
    return [Document(f"doc#{i}", text, "test") for i, text in enumerate(TEXTS * 2)]


def loaded_in(folder: Path, family: str, device: str, dtype: torch.dtype):
    import dataclasses

    from models import families
    from models.core.specs import ModelSpec

    spec = ModelSpec(family, "tiny", "hub", str(folder), "test", "random weights")
    loaded = families.get(family).load(spec, "cpu", "float32")
    return dataclasses.replace(loaded, model=loaded.model.to(device, dtype), device=device,
                               dtype=str(dtype).removeprefix("torch."))


def compare(folder: Path, family: str, device: str, dtype: torch.dtype) -> int:
    """Run the documents padded together and one by one, fused and PyTorch; returns the fused launches."""
    loaded = loaded_in(folder, family, device, dtype)
    runner = statistics.StatisticsRunner(loaded, max_tokens=64, max_padding=100.0)
    launches = []
    real = statistics_triton.layer_statistics

    def counted(*args, **kwargs):
        launches.append(args[3])  # causal or not
        return real(*args, **kwargs)

    statistics_triton.layer_statistics = counted
    try:
        fused, _ = runner.run(documents())
        alone = [runner.run([document])[0][0] for document in documents()[:3]]
    finally:
        statistics_triton.layer_statistics = real
    os.environ["ATTN_EXPLORER_CORPUS_KERNEL"] = "torch"
    try:
        reference, _ = runner.run(documents())
    finally:
        del os.environ["ATTN_EXPLORER_CORPUS_KERNEL"]
    rtol, atol = TOLERANCE[dtype]
    for found, expected in [*zip(fused, reference), *zip(alone, reference)]:
        for name in statistics.STATISTICS:
            np.testing.assert_allclose(found.statistics[name], expected.statistics[name], rtol=rtol, atol=atol,
                                       err_msg=f"{family} {dtype} {found.doc_id} {name}")
        np.testing.assert_allclose(found.peak_value, expected.peak_value, rtol=rtol, atol=atol)
        np.testing.assert_array_equal(found.peak_query, expected.peak_query)
        np.testing.assert_array_equal(found.peak_key, expected.peak_key)
    assert launches and all(causal == (family == "causal_lm") for causal in launches)
    return len(launches)


def run_all(device: str, folder: Path) -> list[str]:
    from tests.tiny_text_models import save_tiny_causal_lm, save_tiny_encoder

    llama = save_tiny_causal_lm(folder / "llama")
    bert = save_tiny_encoder(folder / "bert")
    done = []
    for blocks, dtypes in (((64, 64), (torch.float32, torch.bfloat16)), ((16, 16), (torch.float32,))):
        statistics_triton.BLOCKS = blocks  # one block per document, then several (cells and peaks across blocks)
        for family, path in (("causal_lm", llama), ("encoder", bert)):
            for dtype in dtypes:
                launches = compare(path, family, device, dtype)
                done.append(f"{family} {dtype} blocks {blocks}: {launches} launches")
    statistics_triton.BLOCKS = (64, 64)
    return done


def test_a_mask_the_kernel_does_not_describe_goes_the_pytorch_path():
    lengths = torch.tensor([3, 5])
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None] & (torch.arange(5) < lengths[:, None])[:, None, :]
    assert statistics_triton.described(causal, lengths) is True
    padding = (torch.arange(5) < lengths[:, None])[:, None, :].expand(2, 5, 5)
    assert statistics_triton.described(padding, lengths) is False
    window = causal & ~torch.ones(5, 5, dtype=torch.bool).tril(-3)  # a sliding window of 3 keys
    assert statistics_triton.described(window, lengths) is None
    query = torch.zeros(1, 2, 4, 8)
    assert not statistics_triton.usable(query, query, torch.zeros(1, 2, 4, 4))  # T5's position bias
    assert not statistics_triton.usable(query.double(), query.double(), None)  # float64: the PyTorch path


def test_the_fused_kernel_equals_the_pytorch_path_in_the_interpreter(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tests.test_corpus_triton", str(tmp_path)],
                          cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert done.stdout.strip().splitlines()[-1] == "6 cases equal the PyTorch path"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.cuda
def test_the_compiled_kernel_equals_the_pytorch_path_on_the_gpu(tmp_path):
    assert len(run_all("cuda", tmp_path)) == 6


if __name__ == "__main__":  # the interpreter's process: python -m tests.test_corpus_triton FOLDER
    import tests.conftest  # noqa: F401  (offline, threads)

    cases = run_all("cpu", Path(sys.argv[1]))
    print("\n".join(cases))
    print(f"{len(cases)} cases equal the PyTorch path")
