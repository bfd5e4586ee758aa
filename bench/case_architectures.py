"""``architectures`` case (issue 36): what drawing a model exactly costs on the paths capture chooses.

Three shapes of 8 layers × 8 heads, d = 512, random weights (seeded, so both sides hold the same model), n = 1,024
word tokens, the GPT page's run (``causal_lm.run``: tokenise, forward with capture, top-10, the residual stream):

- ``gemma2`` (soft-capped scores) and ``gpt_oss`` (attention sinks): capture runs the model's own eager attention for
  the forward and keeps q and k. Baseline: the same model's eager forward (``attn_implementation="eager"``), which is
  what the model costs with these terms honoured. Target: ours ≤ that forward (+ 10% for the page's own work).
- ``bloom`` (its attention does not pass through the AttentionInterface): the eager path, ``output_attentions``
  read per call. Baseline: the eager forward with ``output_attentions=True``. Target: ours ≤ 1.1 × baseline.
- ``llama`` (served by SDPA): the capture path against the SDPA forward, for the record (the GPT-2 shape's
  ``causal_lm`` case is the one with a target).

``python -m bench.run --cases architectures``.
"""
from __future__ import annotations

from bench.measure import alternate, paired
from bench.worker import worker

SHAPES = ("llama", "gemma2", "gpt_oss", "bloom")
TARGETS = {"gemma2": 1.1, "gpt_oss": 1.1, "bloom": 1.1}
SIZE = {"hidden_size": 512, "n_embd": 512, "intermediate_size": 1024, "num_hidden_layers": 8, "n_layer": 8,
        "num_attention_heads": 8, "n_head": 8, "num_key_value_heads": 4, "head_dim": 64}


def _config(model_type: str):
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    defaults = config_class().to_dict()
    values = {name: value for name, value in SIZE.items() if name in defaults}
    values.update(vocab_size=1001, max_position_embeddings=4096)
    if model_type == "gpt_oss":
        values.update(num_local_experts=4, num_experts_per_tok=2, sliding_window=128)
    if model_type == "gemma2":
        values.update(sliding_window=4096, query_pre_attn_scalar=64)
    return config_class(**values)


def _paths(model_type: str, n: int):
    import copy

    import torch
    import transformers

    from bench.case_causal_lm import word_tokenizer
    from models.core import capture, loading
    from models.core.inputs import TextInput
    from models.core.loading import LoadedModel
    from models.core.specs import ModelSpec
    from models.families.causal_lm import model as causal_lm

    capture.register()
    config = _config(model_type)
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    ours_model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="capture").eval()
    ours_model.load_state_dict(reference.state_dict())
    found = capture.probe(ours_model)
    if not found.recorded or found.not_causal:  # the path the loader would take: its own eager attention
        ours_model = reference
        description = capture.EAGER_PATH_DESCRIPTION
    else:
        description = found.description()
    spec = ModelSpec("causal_lm", f"bench-{model_type}", "local", "random", "n/a", "random weights (benchmark)")
    loaded = LoadedModel(spec, ours_model.requires_grad_(False), word_tokenizer(), "cpu", "float32", 4096,
                         capture=description)
    eager_path = description == capture.EAGER_PATH_DESCRIPTION
    baseline_model = reference
    if model_type == "llama":
        baseline_model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
        baseline_model.load_state_dict(reference.state_dict())
    tokenizer = loaded.tokenizer

    def ours(prompt: str):
        return causal_lm.run(loaded, TextInput(prompt, n))

    def baseline(prompt: str):
        ids = tokenizer(prompt)["input_ids"][:n]
        with torch.inference_mode():
            out = baseline_model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=1,
                                 output_attentions=eager_path)
        return torch.softmax(out.logits[0, -1].float(), -1).topk(10)

    del loading
    return ours, baseline, description


def task_architectures(job: dict) -> dict:
    from bench.case_causal_lm import word_prompt

    ours, baseline, description = _paths(job["model_type"], job["n"])
    warm = word_prompt(64, seed=1)
    ours(warm)
    baseline(warm)
    prompt = word_prompt(job["n"])
    ours_s, base_s = alternate(lambda: ours(prompt), lambda: baseline(prompt), job["repeats"], "cpu")
    return {"ours_samples": ours_s, "baseline_samples": base_s, "path": description}


def case_architectures(n: int, repeats: int, threads: int) -> list[dict]:
    rows = []
    for model_type in SHAPES:
        timing = worker({"task": "architectures", "model_type": model_type, "n": n, "repeats": repeats,
                         "device": "cpu", "threads": threads})
        ours_s, baseline_s, ratio = paired(timing["ours_samples"], timing["baseline_samples"])
        target = TARGETS.get(model_type)
        rows.append({"case": "architectures", "model_type": model_type, "n": n, "ours_s": ours_s,
                     "baseline_s": baseline_s, "ratio": ratio, "path": timing["path"][:80],
                     "baseline": "the model's SDPA forward" if model_type == "llama" else
                     "the model's eager forward" + (" with output_attentions" if model_type == "bloom" else ""),
                     "target": f"ratio <= {target}" if target else "", "ok": ratio <= target if target else None,
                     "threads": threads, "ours_samples": timing["ours_samples"],
                     "baseline_samples": timing["baseline_samples"]})
    return rows
