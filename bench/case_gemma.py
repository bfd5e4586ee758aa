"""``gemma`` case (issue 39): Gemma 3 270M, the packaged real weights, 2,048 tokens through the GPT page's run
against its own SDPA forward.

- ours: ``models.families.causal_lm.model.run`` on the model the page loads (capture: every layer's q and k kept,
  its sliding-window masks kept as rules; the residual stream for the logit lens; the top-10 next tokens);
- baseline: the same converted weights loaded with ``attn_implementation="sdpa"``, the same tokenisation, one
  forward (``logits_to_keep=1``, as ours) and the top-10.

The prompt is the GPT page's long sample ("Beyond the window") repeated until it is 2,048 tokens. Timing alternates
the two in one fresh process (``bench/measure.py``); ``extra_mb`` compares their peak memory, each in fresh
processes. Target: ratio ≤ 1.1 at n = 2,048.
"""
from __future__ import annotations

from bench.measure import alternate, measure_memory, paired
from bench.worker import worker

TARGET_RATIO = 1.1
N = 2048


def prompt() -> str:
    from models.families.causal_lm import model as causal_lm

    return "\n\n".join([causal_lm.long_sample()] * 4)  # 4 × 612 tokens: cut at the limit


def gemma_paths(device: str, modes=("ours", "baseline")) -> dict:
    """``{mode: fn(text, limit)}``: the page's run and the plain SDPA forward, on the same converted weights."""
    import torch
    import transformers

    from models import families
    from models.core.inputs import TextInput
    from models.families.causal_lm import model as causal_lm

    spec = families.spec("causal_lm", "Gemma-3-270M")
    paths = {}
    if "ours" in modes:
        loaded = families.load(spec, device)

        def ours(text: str, limit: int):
            return causal_lm.run(loaded, TextInput(text, limit))

        paths["ours"] = ours
    if "baseline" in modes:
        folder = causal_lm.gemma3_folder()
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa",
                                                                  dtype=torch.float32).to(device).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)

        def baseline(text: str, limit: int):
            ids = tokenizer(text)["input_ids"][:limit]
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False,
                               logits_to_keep=1).logits
                return torch.softmax(logits[0, -1].float(), dim=-1).topk(10)

        paths["baseline"] = baseline
    return paths


def task_gemma_time(job: dict) -> dict:
    paths = gemma_paths(job["device"])
    for fn in paths.values():
        fn("The Eiffel Tower is in the city of", 64)  # warm up
    text = prompt()
    result = paths["ours"](text, job["n"])
    ours_s, base_s = alternate(lambda: paths["ours"](text, job["n"]), lambda: paths["baseline"](text, job["n"]),
                               job["repeats"], job["device"])
    return {"ours_samples": ours_s, "baseline_samples": base_s, "tokens": len(result.tokens),
            "held_mb": result.maps("self").nbytes() / 2**20}


def task_gemma_memory(job: dict) -> dict:
    fn = gemma_paths(job["device"], modes=(job["mode"],))[job["mode"]]
    fn("The Eiffel Tower is in the city of", 64)
    text = prompt()
    memory, _ = measure_memory(lambda: fn(text, job["n"]), job["device"])
    return memory


def case_gemma(device: str, repeats: int, threads: int, n: int = N) -> dict:
    common = {"n": n, "device": device, "threads": threads}
    timing = worker({"task": "gemma_time", "repeats": repeats, **common})
    base = worker({"task": "gemma_memory", "mode": "baseline", **common})
    ours = worker({"task": "gemma_memory", "mode": "ours", **common})
    ours_s, baseline_s, ratio = paired(timing["ours_samples"], timing["baseline_samples"])
    return {"case": "gemma", "n": timing["tokens"], "ours_s": ours_s, "baseline_s": baseline_s, "ratio": ratio,
            "extra_mb": ours["peak_mb"] - base["peak_mb"], "held_mb": timing["held_mb"], "device": device,
            "threads": threads, "ours_samples": timing["ours_samples"],
            "baseline_samples": timing["baseline_samples"],
            "ours": "causal_lm.run (Gemma 3 270M, capture, residual stream, top-10)",
            "baseline": "sdpa forward of the same weights (logits_to_keep=1) + tokenise + top-10",
            "target": f"ratio <= {TARGET_RATIO} at n = {N}", "ok": ratio <= TARGET_RATIO}
