"""Decoder-only vision–language models (LLaVA, SmolVLM/Idefics3, Qwen2-VL, PaliGemma, and the mini VLM, which is a
LLaVA): the prompt, generation with each generated token's attention kept, where every image token came from, and the
visual attention sinks.

**Capture during generation.** The language model's attention layers call the ``"capture"`` attention function
(models/core/capture.py). ``RowRecorder`` (a ``capture.Recorder``) keeps, per layer, only what a word's map needs:
the post-RoPE query of each position that *produced* a generated token (the last prompt position, then each
generated token but the last) and every key once (the prefill's keys, then each step's new key, as the KV cache grows).
A word's attention is then ``softmax(q kᵀ · scaling)`` over the keys its row was allowed to see, recomputed when a
view asks (``results.RecomputedAttention``), so the maps cost the bytes of those queries and keys, not
``layers × heads × words × tokens`` floats. Greedy decoding is recorded while ``generate`` runs; beam search
generates first and then runs the chosen caption once, teacher-forced, with the same recorder.

**Visual attention sinks** (Kang et al. 2025, "See What You Are Told: Visual Attention Sink in Large Multimodal
Models"; the massive activations of Sun et al. 2024): image tokens whose hidden state at the language model's middle
layer has an activation far above the other image tokens' (``SINK_RATIO`` × their median of the per-token maximum);
they draw attention whatever the word, so the page marks them and can leave them out of the colour scale.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from models.core import capture, hooks
from models.core.results import RecomputedAttention
from models.families.captioning import geometry

SINK_RATIO = 10.0  # an image token is a sink when its largest |activation| is this many times the image tokens' median
DEFAULT_INSTRUCTION = "Describe this image in one sentence."


@contextlib.contextmanager
def first_output(module: torch.nn.Module):
    """The output (first tensor, detached, on the CPU) of ``module``'s first forward in this call: a hook installed
    through ``models.core.hooks`` (it acts only for the forwards of this ``with`` block, never for another session's
    forward through the same cached model, and is removed on exit). Yields a list that holds it once the forward ran."""
    kept: list[torch.Tensor] = []

    def keep(mod, args, output) -> None:  # returns None: the output is unchanged
        if not kept:
            kept.append(hooks.hidden_of(output).detach().float().cpu())

    with hooks.installed(hooks.after(module, keep)):
        yield kept


# --- what the model is -----------------------------------------------------------------------------------------

def geometry_kind(config) -> str:
    """How this model's processor lays out image tokens: ``idefics3`` (tiles + thumbnail, pixel shuffle),
    ``qwen2_vl`` (dynamic grid, 2 × 2 merges) or ``grid`` (one frame: LLaVA, PaliGemma, the mini)."""
    model_type = getattr(config, "model_type", "")
    if model_type in ("idefics3", "smolvlm"):
        return "idefics3"
    if model_type in ("qwen2_vl", "qwen2_5_vl"):
        return "qwen2_vl"
    if model_type in ("llava", "paligemma"):
        return "grid"
    raise ValueError(f"the captioning page maps image tokens back to pixels for LLaVA, SmolVLM/Idefics3, Qwen2-VL "
                     f"and PaliGemma models; '{model_type}' is none of them")


def language_model(model) -> torch.nn.Module:
    """The causal LM that reads the image tokens (whatever the wrapper calls it)."""
    inner = getattr(model, "model", model)
    for name in ("language_model", "text_model"):
        found = getattr(inner, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    raise ValueError(f"{type(model).__name__} has no language model this page can find")


def decoder_layers(model) -> list[torch.nn.Module]:
    return list(language_model(model).layers)


# --- the prompt --------------------------------------------------------------------------------------------------

def prompt_text(processor, model_type: str, instruction: str) -> str:
    """The text the processor expands: the chat template when the processor has one, else each model's own format."""
    instruction = instruction.strip() or DEFAULT_INSTRUCTION
    if model_type == "paligemma":  # one <image> mark, which the processor expands before <bos>; a task prefix
        task = instruction if instruction != DEFAULT_INSTRUCTION else "caption en"
        return getattr(processor, "image_token", "<image>") + task
    if getattr(processor, "chat_template", None):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}]
        return processor.apply_chat_template(messages, add_generation_prompt=True)
    image = getattr(processor, "image_token", "<image>")
    if model_type == "qwen2_vl":
        return f"<|vision_start|>{image}<|vision_end|>{instruction}"
    if model_type in ("idefics3", "smolvlm"):
        return f"User:{image}{instruction}<end_of_utterance>\nAssistant:"
    return f"USER: {image}\n{instruction} ASSISTANT:"


def processor_inputs(loaded, picture, instruction: str, tiles: bool = True) -> dict:
    """The processor's tensors for one picture and the prompt, on the model's device and dtype."""
    processor = loaded.processor
    model_type = loaded.model.config.model_type
    kwargs = {}
    if geometry_kind(loaded.model.config) == "idefics3" and not tiles:
        kwargs["do_image_splitting"] = False
    text = prompt_text(processor, model_type, instruction)
    inputs = processor(text=text, images=picture, return_tensors="pt", **kwargs)
    inputs.pop("labels", None)
    dtype = next(loaded.model.parameters()).dtype
    return {k: (v.to(loaded.device, dtype) if torch.is_floating_point(v) else v.to(loaded.device))
            for k, v in inputs.items()}


def regions_of(loaded, picture_size: tuple[int, int], inputs: dict, tiles: bool = True) -> geometry.TokenRegions:
    """Where each image token of ``inputs`` came from, by the model's geometry; checked against the count of image
    tokens in the prompt."""
    config = loaded.model.config
    kind = geometry_kind(config)
    image_processor = loaded.processor.image_processor
    settings = image_processor.to_dict()
    vision = config.vision_config
    if kind == "idefics3":
        if not tiles:
            settings["do_image_splitting"] = False
        regions = geometry.idefics3(picture_size, settings, int(vision.patch_size), int(config.scale_factor))
    elif kind == "qwen2_vl":
        grid = tuple(int(g) for g in inputs["image_grid_thw"][0])
        regions = geometry.qwen2_vl(picture_size, grid, int(vision.patch_size), int(vision.spatial_merge_size))
    else:
        pad = bool(settings.get("do_pad")) and type(image_processor).__name__.startswith("Llava")
        regions = geometry.single_frame(picture_size, settings, int(vision.patch_size), pad_to_square=pad)
    found = int((inputs["input_ids"][0] == config.image_token_id).sum())
    if found != regions.count:
        raise ValueError(f"the prompt holds {found} image tokens but the processor's geometry gives {regions.count} "
                         "regions: this processor does something the captioning page does not map back yet")
    return regions


# --- capture of the generated tokens' rows -------------------------------------------------------------------------

@dataclass
class _Layer:
    name: str
    scaling: float = 1.0
    keys: list[torch.Tensor] = field(default_factory=list)  # (kv_heads, n, d) pieces, in position order
    key_count: int = 0
    queries: list[torch.Tensor] = field(default_factory=list)  # (heads, r, d) pieces
    allowed: list[np.ndarray] = field(default_factory=list)  # (r, keys at that call) bool


class RowRecorder(capture.Recorder):
    """Keeps, for every language-model attention layer, the queries of the positions ≥ ``keep_from`` and every key,
    across the calls of one generation (see the module docstring). ``record`` is called by the capture attention
    function in the thread that set it (a ContextVar), never by another session's forward."""

    def __init__(self, model, keep_from: int):
        super().__init__(module_names={id(m): name for name, m in model.named_modules()})
        self.language = {id(m) for m in language_model(model).modules()}
        self.keep_from = keep_from
        self.layers: dict[int, _Layer] = {}
        self.notes: set[str] = set()

    def record(self, module, query, key, attention_mask, kwargs) -> None:
        if id(module) not in self.language:
            return  # the vision encoder's attention
        q_len, k_len = query.shape[2], key.shape[2]
        layer = self.layers.setdefault(id(module), _Layer(self.module_names.get(id(module), "?")))
        scaling = kwargs.get("scaling")
        layer.scaling = float(scaling) if scaling is not None else 1.0 / float(query.shape[-1]) ** 0.5
        if kwargs.get("softcap"):
            self.notes.add("this model caps its attention scores (soft-capping); the maps are recomputed without "
                           "the cap and differ slightly from what the model used")
        if k_len > layer.key_count:
            layer.keys.append(key[0, :, layer.key_count:k_len].detach().to("cpu", torch.float32).clone())
            layer.key_count = k_len
        first = k_len - q_len  # the absolute position of this call's first query (the cache holds the rest)
        start = max(0, self.keep_from - first)
        if start >= q_len:
            return
        layer.queries.append(query[0, :, start:].detach().to("cpu", torch.float32).clone())
        allowed, bias = self._mask(module, attention_mask, kwargs, q_len, k_len)
        if bias is not None:
            self.notes.add("this model adds a position bias to its scores that the maps leave out")
        layer.allowed.append(np.asarray(allowed[0][start:], dtype=bool))

    def maps(self, query_tokens: list[str], key_tokens: list[str]) -> RecomputedAttention:
        """The kept rows as ``RecomputedAttention`` (kind ``self``): one row per produced token over every key."""
        ordered = [self.layers[key] for key in self.layers]  # forward order = layer order
        if not ordered:
            raise ValueError("no language-model attention was recorded: load the model with the capture attention")
        keys_total = len(key_tokens)
        queries, keys, masks, mask_index, seen = [], [], [], [], {}
        for layer in ordered:
            q = torch.cat(layer.queries, 1).numpy()  # (heads, rows, d)
            k = torch.cat(layer.keys, 1)[:, :keys_total].numpy()  # (kv_heads, keys, d)
            rows = np.zeros((q.shape[1], keys_total), dtype=bool)
            at = 0
            for piece in layer.allowed:
                width = min(piece.shape[1], keys_total)
                rows[at:at + len(piece), :width] = piece[:, :width]
                at += len(piece)
            digest = rows.tobytes()
            if digest not in seen:
                seen[digest] = len(masks)
                masks.append(rows)
            queries.append(np.ascontiguousarray(q[:, :len(query_tokens)]))
            keys.append(np.ascontiguousarray(k))
            mask_index.append(seen[digest])
        masks = [m[:len(query_tokens)] for m in masks]
        return RecomputedAttention("self", list(query_tokens), list(key_tokens), queries, keys,
                                   [layer.scaling for layer in ordered], masks, mask_index)

    def kept_bytes(self) -> int:
        """Bytes of the kept queries and keys."""
        return sum(t.numel() * t.element_size() for layer in self.layers.values()
                   for t in (*layer.queries, *layer.keys))


@contextlib.contextmanager
def recording_rows(model, keep_from: int):
    """Inside the block, this thread's language-model attention calls of ``model`` are kept by a ``RowRecorder``."""
    recorder = RowRecorder(model, keep_from)
    with capture.observing(model, recorder):
        yield recorder


# --- sinks -------------------------------------------------------------------------------------------------------

def sink_scores(hidden: torch.Tensor, image_positions: np.ndarray) -> np.ndarray:
    """Per image token, its largest |activation| at a middle layer over the image tokens' median of the same:
    ``hidden`` (1, N, D) float32, ``image_positions`` (tokens,) -> (tokens,) float32 ratios."""
    peaks = hidden[0, torch.as_tensor(image_positions)].abs().amax(-1).numpy()  # (tokens,)
    return (peaks / max(float(np.median(peaks)), 1e-12)).astype(np.float32)


def middle_layer(model) -> torch.nn.Module:
    layers = decoder_layers(model)
    return layers[len(layers) // 2]
