"""The captioning minis' model cards, written from each model's ``metrics.json`` so every number is the measured one."""
from __future__ import annotations

from models.minis.captioning import scenes

TITLES = {
    "show-attend-tell": "Show, Attend and Tell (CNN grid + LSTM with additive attention; Xu et al. 2015)",
    "encoder-decoder": "Encoder–decoder Transformer (ViT encoder, GPT-2 decoder with cross-attention)",
    "decoder-only": "Decoder-only VLM in LLaVA's style (projected patch tokens before the text in one causal LM)",
}
SHORT_TITLES = {"show-attend-tell": "Show, Attend and Tell", "encoder-decoder": "Encoder–decoder Transformer",
                "decoder-only": "Decoder-only VLM (LLaVA-style)"}
ARCHITECTURE_TEXT = {
    "show-attend-tell": (
        "a CNN (3 × 3 convolutions, widths 32 → 64 → 96 → 128, stride 8) gives an 8 × 8 grid of 128-d annotation "
        "vectors plus a learned position embedding; an LSTM (256) reads [word embedding; context] with additive "
        "attention over the 64 cells (e = wᵀ tanh(W a + U h)), the gating scalar β and the deep output of eq. 7; "
        "trained with the doubly stochastic regulariser (eq. 14, mean over the cells, λ = 1)."),
    "encoder-decoder": (
        "transformers `VisionEncoderDecoderModel`: a ViT (64 px, 8 px patches → 8 × 8 tokens + [CLS], 4 layers × 4 "
        "heads, width 128) and a GPT-2 decoder (3 layers × 4 heads, width 128) whose every block cross-attends to the "
        "65 encoder tokens."),
    "decoder-only": (
        "transformers `LlavaForConditionalGeneration`: a ViT vision tower initialised from the encoder–decoder "
        "mini's encoder ({tower}; its last layer, [CLS] dropped: 64 patch tokens), a 2-layer GELU MLP projector, and "
        "a Llama LM (3 layers × 4 heads, width 128) that reads the 64 projected patch tokens, then `<bos>` and the "
        "caption, causally."),
}


def _tower(m: dict) -> str:
    tower = m.get("vision_tower", {})
    import re

    source = tower.get("from", "encoder-decoder")
    step = re.search(r"step(\d+)", source)
    where = (f"its checkpoint after {int(step.group(1)):,} of its steps" if step else "its weights as shipped")
    return (f"{where}, trained further with the rest" if tower.get("trained") else
            f"{where}, **frozen**, as LLaVA keeps its pretrained CLIP encoder")


def _tower_source(m: dict) -> str:
    """Where the reproduce command's vision tower comes from."""
    if "vision_tower" not in m:
        return ""
    if "step" in m["vision_tower"].get("from", ""):
        return ("; the vision tower's encoder–decoder checkpoint is the `checkpoint_every` save of a run of that "
                "command for the encoder–decoder")
    return "; run after the encoder–decoder mini, whose saved encoder in `--out` becomes the vision tower"


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def pointing_line(summary: dict, what: str) -> str:
    line = (f"{what}: **{_percent(summary['default'])}** ± {_percent(summary['default_se'])} of "
            f"{summary['words']:,} words hit their object (random cell: {_percent(summary['random'])})")
    if "right_object" in summary:
        line += (f"; in scenes with 2–3 objects the top cell lies mostly on the word's own object "
                 f"{_percent(summary['right_object'])} of the time (random cell: "
                 f"{_percent(summary['right_object_random'])})")
    if len(summary.get("per_layer", [])) > 1:
        layers = ", ".join(f"{i}: {_percent(v)}" for i, v in enumerate(summary["per_layer"]))
        line += f". Per layer (heads averaged): {layers}"
        if "best_layer" in summary:
            line += (f"; the best layer on the validation stream is {summary['best_layer']}, "
                     f"{_percent(summary['best_layer_test'])} on the test stream")
    return line + "."


def _stopped(m: dict) -> str:
    """What the card says of weights that are a stopped run's checkpoint, not its end."""
    stopped = m.get("stopped_at")
    if not stopped:
        return ""
    train = m.get("train", {})
    return (f" **These weights are a checkpoint**: the run was set for {train.get('steps', 0):,} steps or "
            f"{train.get('minutes', 0):g} CPU minutes and was stopped after its save at step {stopped['step']:,}, "
            f"its learning rate still {_percent(stopped['learning_rate_left'])} of its peak (not annealed).")


def command(m: dict) -> str:
    """The training command that made this model, from what its metrics recorded."""
    train = m.get("train", {})
    parts = ["python -m models.minis.captioning.train", "--models", m["model"]]
    if train.get("steps"):
        parts += ["--steps", str(train["steps"])]
    if train.get("minutes"):
        parts += ["--minutes", f"{train['minutes']:g}"]
    tower = m.get("vision_tower")
    if tower:
        parts += ["--vision-from", "ENCODER_DECODER_CHECKPOINT"] if "step" in tower.get("from", "") else []
        parts += ["--train-vision"] if tower.get("trained") else []
    return " ".join(parts)


def card_text(m: dict) -> str:
    name = m["model"]
    train = m.get("train", {})
    minutes = m.get("train_cpu_seconds", 0) / 60
    wall = m.get("train_wall_seconds", 0) / 60
    lines = [
        f"# captioning/{name} — {TITLES[name]}",
        "",
        ("Trained by this project so the captioning page has three architectures to compare with no download. **It "
         "describes generated scenes of coloured shapes, nothing else**: on a photo it still answers in the scene "
         "grammar."),
        "",
        f"- Architecture: {ARCHITECTURE_TEXT[name].format(tower=_tower(m))} {m['parameters']:,} parameters"
        + (f" ({m['trained_parameters']:,} trained)" if m.get("trained_parameters") != m["parameters"] else "")
        + f", {m['weights_bytes'] / 2**20:.1f} MB of weights (float16 on disk, read into float32; every number "
          "below is measured on them).",
        "- Input: 64 × 64 px, normalised with mean 0.5 and std 0.5 per channel.",
        ("- Data (`models/minis/captioning/scenes.py`): one to three of the DETR and ViT minis' shapes (circle, "
         "square, triangle, cross, ring, star) in distinct cells of a 3 × 3 grid, **colour and shape drawn "
         f"independently** (six hue names), on a flat greyish background or (up to {_percent(scenes.PAGE_CLUTTER)} "
         "of scenes) a desaturated crop of the CC0 sample photos. The caption is fixed by the scene: objects in "
         "reading order, `a <colour> <shape> at the <position>`, joined by `,` and `and`; every word knows the object "
         "it names and every object its pixel mask."),
        (f"- Training: AdamW (lr {train.get('learning_rate', '?')}, weight decay {train.get('weight_decay', '?')}, "
         f"warm-up {train.get('warmup_steps', '?')} steps, cosine decay), batch {train.get('batch_size', '?')}, "
         f"{m.get('steps', 0):,} steps ({m.get('images_seen', 0):,} captions) drawn from a pool of "
         f"{train.get('pool_size', '?'):,} scenes renewed by {train.get('pool_fresh', '?')} every step, each "
         f"through one of the square's 8 symmetries; **{minutes:.1f} CPU minutes on one thread** ({wall:.1f} min "
         "wall clock on a machine shared with other jobs)." + _stopped(m)),
        "",
        f"## Measured on {m['test_scenes']:,} held-out scenes (a separate random stream)",
        "",
        f"- Caption exact match (greedy): **{_percent(m['exact_match'])}**; by objects in the scene: "
        + ", ".join(f"{k}: {_percent(v)}" for k, v in m["exact_by_objects"].items())
        + f". Objects described right (colour, shape and position): {_percent(m['objects_correct'])}. Next-word "
        f"accuracy with the reference forced through the decoder: {_percent(m['word_accuracy'])}.",
        "- Pointing game (the word's most-attended of the 8 × 8 cells touches the mask of the object it names; the "
        "reference caption forced through the decoder; the map is the attention that produced the word"
        + ("" if name == "show-attend-tell" else ", averaged over heads and layers") + "):",
        "  - " + pointing_line(m["pointing"]["nouns"], "Nouns (shape words)"),
        "  - " + pointing_line(m["pointing"]["colours"], "Colour words"),
        "",
        f"Reproduce: `{command(m)}` ("
        + (f"stopped after its step-{m['stopped_at']['step']:,} checkpoint; " if m.get("stopped_at") else "")
        + "seed 0; results vary slightly with the hardware's floating-point order"
        + _tower_source(m) + "). Licence: the weights are this project's; "
        "the photo backgrounds are CC0 / public domain (`sample_data/images/LICENSES`).",
    ]
    return "\n".join(lines) + "\n"
