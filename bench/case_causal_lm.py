"""``causal_lm`` case: a long prompt to the first head view, our capture path against the plain SDPA forward.

GPT-2-small shape (12 layers × 12 heads, d = 768, 50,257 tokens, random weights, seeded, so both paths hold the same
model), n = 512, 1024, 2048 tokens by default:

- ours: ``models.families.causal_lm.model.run`` with capture, then layer 0 head 0 and its mask (what the first head view draws);
- baseline: the same model loaded with ``attn_implementation="sdpa"`` doing the same tokenisation, forward
  (``logits_to_keep=1``, as our path) and top-10.

``extra_mb`` = our peak memory above the start minus the baseline's, each measured in fresh processes
(``bench/measure.py``) and compared as medians; ``bytes``: what the result holds (``RecomputedAttention.nbytes``).
Target: ratio ≤ 1.3 and extra_mb ≤ 300 at n = 2048.
"""
from __future__ import annotations

from bench.measure import alternate, measure_memory, paired
from bench.worker import worker

TARGET = {"ratio": 1.3, "extra_mb": 300, "at_n": 2048}


def gpt2_small(attn_implementation: str, n_positions: int, device: str):
    """GPT-2 small (12 layers, 12 heads, d = 768, 50,257 tokens) with random weights, seeded: both paths identical."""
    import torch
    import transformers

    from models.core import capture

    capture.register()
    config = transformers.GPT2Config(n_positions=max(1024, n_positions))
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation=attn_implementation)
    return model.to(device).eval().requires_grad_(False)


def word_tokenizer(words: int = 1000):
    """A whitespace word-level tokenizer over "w0".."w999": one token per word, so a prompt of n words is n tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(words)}
    vocab["[UNK]"] = words
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")


def word_prompt(n: int, seed: int = 0) -> str:
    import numpy as np

    return " ".join(f"w{i}" for i in np.random.default_rng(seed).integers(0, 1000, n))


def causal_lm_paths(n: int, device: str, modes=("ours", "baseline")) -> dict:
    """``{mode: fn(prompt, n)}`` for our capture path and the plain SDPA forward, on the same random weights."""
    import torch

    from models.core.inputs import TextInput
    from models.core.loading import LoadedModel
    from models.core.specs import ModelSpec
    from models.families.causal_lm import model as causal_lm

    tokenizer = word_tokenizer()
    paths = {}
    if "ours" in modes:
        spec = ModelSpec("causal_lm", "bench-gpt2-small", "local", "random", "n/a", "random weights (benchmark)")
        loaded = LoadedModel(spec, gpt2_small("capture", n, device), tokenizer, device, "float32", max(1024, n))

        def ours(prompt: str, limit: int):
            result = causal_lm.run(loaded, TextInput(prompt, limit))
            maps = result.maps("self")
            return result, maps.head(0, 0), maps.allowed(0)  # what the first head view draws

        paths["ours"] = ours
    if "baseline" in modes:
        model = gpt2_small("sdpa", n, device)

        def baseline(prompt: str, limit: int):
            ids = tokenizer(prompt)["input_ids"][:limit]
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False, logits_to_keep=1).logits
                return torch.softmax(logits[0, -1].float(), dim=-1).topk(10)

        paths["baseline"] = baseline
    return paths


def task_causal_lm_time(job: dict) -> dict:
    n, device = job["n"], job["device"]
    paths = causal_lm_paths(n, device)
    warm = word_prompt(64, seed=1)
    for fn in paths.values():
        fn(warm, 64)
    prompt = word_prompt(n)
    ours_s, base_s = alternate(lambda: paths["ours"](prompt, n), lambda: paths["baseline"](prompt, n),
                               job["repeats"], device)
    return {"ours_samples": ours_s, "baseline_samples": base_s}


def task_causal_lm_memory(job: dict) -> dict:
    n, device, mode = job["n"], job["device"], job["mode"]
    fn = causal_lm_paths(n, device, modes=(mode,))[mode]
    fn(word_prompt(64, seed=1), 64)
    prompt = word_prompt(n)
    memory, result = measure_memory(lambda: fn(prompt, n), device)
    if mode == "ours":
        memory["result_bytes"] = result[0].maps("self").nbytes()
    return memory


def _median_run(runs: list[dict]) -> dict:
    """The run whose peak is the median (the upper median for an even count)."""
    return sorted(runs, key=lambda r: r["peak_mb"])[len(runs) // 2]


def case_causal_lm(n: int, device: str, repeats: int, threads: int, memory_repeats: int = 3) -> dict:
    common = {"n": n, "device": device, "threads": threads}
    timing = worker({"task": "causal_lm_time", "repeats": repeats, **common})
    # peak RSS of one run depends on where glibc happens to place blocks (a live block above freed ones pins them),
    # so each side is measured in several fresh processes and the medians are compared; every sample is reported
    bases = [worker({"task": "causal_lm_memory", "mode": "baseline", **common}) for _ in range(memory_repeats)]
    ourses = [worker({"task": "causal_lm_memory", "mode": "ours", **common}) for _ in range(memory_repeats)]
    base, ours = _median_run(bases), _median_run(ourses)
    ours_s, baseline_s, ratio = paired(timing["ours_samples"], timing["baseline_samples"])
    row = {"case": "causal_lm", "n": n, "ours_s": ours_s, "baseline_s": baseline_s, "ratio": ratio,
           "extra_mb": ours["peak_mb"] - base["peak_mb"], "bytes": ours["result_bytes"], "device": device,
           "threads": threads, "ours_samples": timing["ours_samples"],
           "baseline_samples": timing["baseline_samples"], "peak_ours_mb": ours["peak_mb"],
           "peak_baseline_mb": base["peak_mb"], "peak_ours_samples_mb": [r["peak_mb"] for r in ourses],
           "peak_baseline_samples_mb": [r["peak_mb"] for r in bases],
           "held_ours_mb": ours.get("held_gpu_mb", ours["held_host_mb"]),
           "baseline": "sdpa forward (logits_to_keep=1) + tokenise + top-10",
           "ours": "causal_lm.run with capture + layer 0 head 0 + mask"}
    if device.startswith("cuda"):
        row["extra_host_mb"] = ours["peak_host_mb"] - base["peak_host_mb"]
    row["target"] = f"ratio <= {TARGET['ratio']} and extra_mb <= {TARGET['extra_mb']} at n = {TARGET['at_n']}"
    row["ok"] = row["ratio"] <= TARGET["ratio"] and row["extra_mb"] <= TARGET["extra_mb"]
    return row
