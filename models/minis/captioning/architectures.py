"""The three captioning minis' architectures and how each turns a batch into next-word logits and word → image maps.

1. ``show-attend-tell``: ``show_attend_tell.ShowAttendTell`` (Xu et al. 2015): CNN grid + LSTM with additive attention.
2. ``encoder-decoder``: a transformers ``VisionEncoderDecoderModel``: a ViT encoder (8 px patches → 8 × 8 tokens +
   [CLS]) and a GPT-2 decoder whose every block cross-attends to the encoder's tokens (the "image captioning
   Transformer" of e.g. CPTR, Liu et al. 2021; TrOCR's shape).
3. ``decoder-only``: a transformers ``LlavaForConditionalGeneration`` (Liu et al. 2023, "Visual Instruction Tuning"):
   the ViT's patch tokens ([CLS] dropped, "default" feature selection) through a 2-layer MLP projector, placed where
   the ``<image>`` placeholders are, before the caption, in one causal Llama LM. As in LLaVA, its vision tower is a
   pretrained encoder kept frozen: the encoder–decoder mini's ViT.

The transformers models are real library classes saved with ``save_pretrained``, so the app loads them with the
capture attention function like any hub model (and the mini VLM through the same LLaVA geometry as LLaVA-1.5).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.minis.captioning import scenes, vocabulary

ARCHITECTURES = ("show-attend-tell", "encoder-decoder", "decoder-only")
PATCH = 8  # ViT patch size: 64 px → 8 × 8 patch tokens
GRID = scenes.IMAGE_SIZE // PATCH
MAX_WORDS = 40  # longest caption: 3 objects × 8 words + 2 separators = 26; positions leave room
MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


@dataclass
class TransformerSizes:
    width: int = 128  # ViT and decoder width
    encoder_layers: int = 4
    decoder_layers: int = 3
    heads: int = 4
    mlp: int = 256


def vit_config(sizes: TransformerSizes):
    from transformers import ViTConfig

    return ViTConfig(image_size=scenes.IMAGE_SIZE, patch_size=PATCH, hidden_size=sizes.width,
                     num_hidden_layers=sizes.encoder_layers, num_attention_heads=sizes.heads,
                     intermediate_size=sizes.mlp, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     image_mean=list(MEAN), image_std=list(STD))


def build_encoder_decoder(sizes: TransformerSizes | None = None):
    from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel

    sizes = sizes or TransformerSizes()
    decoder = GPT2Config(vocab_size=len(vocabulary.WORDS), n_embd=sizes.width, n_layer=sizes.decoder_layers,
                         n_head=sizes.heads, n_inner=sizes.mlp, n_positions=MAX_WORDS + 2, add_cross_attention=True,
                         bos_token_id=vocabulary.BOS_ID, eos_token_id=vocabulary.EOS_ID,
                         pad_token_id=vocabulary.PAD_ID, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.0,
                         tie_word_embeddings=True)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(vit_config(sizes), decoder)
    config.decoder_start_token_id = vocabulary.BOS_ID
    config.bos_token_id, config.eos_token_id, config.pad_token_id = (vocabulary.BOS_ID, vocabulary.EOS_ID,
                                                                      vocabulary.PAD_ID)
    model = VisionEncoderDecoderModel(config=config)
    model.generation_config.update(decoder_start_token_id=vocabulary.BOS_ID, bos_token_id=vocabulary.BOS_ID,
                                   eos_token_id=vocabulary.EOS_ID, pad_token_id=vocabulary.PAD_ID,
                                   do_sample=False, num_beams=1)
    return model


def build_decoder_only(sizes: TransformerSizes | None = None, vision_state: dict | None = None,
                       freeze_vision: bool = True):
    """A LLaVA whose vision tower is a ViT of ``sizes``, loaded from ``vision_state`` (the encoder–decoder mini's
    ``encoder.*`` weights) when given, and then frozen unless ``freeze_vision`` is False."""
    from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    sizes = sizes or TransformerSizes()

    text = LlamaConfig(vocab_size=len(vocabulary.WORDS), hidden_size=sizes.width, intermediate_size=sizes.mlp,
                       num_hidden_layers=sizes.decoder_layers, num_attention_heads=sizes.heads,
                       num_key_value_heads=sizes.heads, max_position_embeddings=GRID * GRID + MAX_WORDS + 2,
                       pad_token_id=vocabulary.PAD_ID, bos_token_id=vocabulary.BOS_ID, eos_token_id=vocabulary.EOS_ID,
                       tie_word_embeddings=True)
    config = LlavaConfig(vision_config=vit_config(sizes), text_config=text, image_token_id=vocabulary.IMAGE_ID,
                         vision_feature_layer=-1, vision_feature_select_strategy="default",
                         projector_hidden_act="gelu", image_seq_length=GRID * GRID, tie_word_embeddings=True)
    config.pad_token_id = vocabulary.PAD_ID
    model = LlavaForConditionalGeneration(config)
    if vision_state is not None:
        missing, unexpected = model.model.vision_tower.load_state_dict(vision_state, strict=False)
        if [m for m in missing if "pooler" not in m] or unexpected:
            raise ValueError(f"the vision tower did not take the encoder's weights: missing {missing}, "
                             f"unexpected {unexpected}")
        model.model.vision_tower.requires_grad_(not freeze_vision)
    model.generation_config.update(bos_token_id=vocabulary.BOS_ID, eos_token_id=vocabulary.EOS_ID,
                                   pad_token_id=vocabulary.PAD_ID, do_sample=False, num_beams=1)
    return model


def encoder_state(encoder_decoder) -> dict:
    """The encoder–decoder's ViT weights, as a LLaVA vision tower (``AutoModel`` of a ``ViTConfig``) names them."""
    return {k: v.detach().clone() for k, v in encoder_decoder.encoder.state_dict().items()}


def decoder_only_prompt(batch: int, device="cpu") -> torch.Tensor:
    """The mini VLM's prompt: 64 ``<image>`` placeholders, then ``<bos>`` (B, 65)."""
    ids = [vocabulary.IMAGE_ID] * (GRID * GRID) + [vocabulary.BOS_ID]
    return torch.tensor([ids] * batch, device=device)


def architecture_of(model) -> str:
    from models.minis.captioning.show_attend_tell import ShowAttendTell

    if isinstance(model, ShowAttendTell):
        return "show-attend-tell"
    if getattr(model.config, "model_type", "") == "vision-encoder-decoder":
        return "encoder-decoder"
    return "decoder-only"


def teacher_forced(model, kind: str, pixels: torch.Tensor, inputs: torch.Tensor, attentions: bool = False):
    """One forward of ``kind`` on normalised pixels (B, 3, 64, 64) and decoder inputs (B, T) that start with
    ``<bos>``. Returns logits (B, T, V) for the next word at each input position and, with ``attentions``, the
    word → image maps ``(B, layers, heads, T, 64)`` over the 8 × 8 grid (row-major): Show, Attend and Tell's α
    (1 layer, 1 head); the decoder's cross-attention to the patch tokens ([CLS] left out); the LM's attention from
    each caption position to the 64 image positions. The transformers models must run eager attention for the maps
    (``output_attentions``): this is the independent reference the app's capture is tested against."""
    if kind == "show-attend-tell":
        logits, alphas, _ = model(pixels, inputs)
        return logits, (alphas[:, None, None] if attentions else None)
    if kind == "encoder-decoder":
        out = model(pixel_values=pixels, decoder_input_ids=inputs, output_attentions=attentions, use_cache=False)
        maps = torch.stack(out.cross_attentions, 1)[..., 1:] if attentions else None  # drop [CLS]
        return out.logits, maps
    prompt = decoder_only_prompt(len(inputs), inputs.device)[:, :-1]  # the image placeholders; inputs has <bos>
    ids = torch.cat([prompt, inputs], 1)
    out = model(input_ids=ids, pixel_values=pixels, attention_mask=(ids != vocabulary.PAD_ID).long(),
                output_attentions=attentions, use_cache=False)
    images = prompt.shape[1]
    maps = torch.stack(out.attentions, 1)[:, :, :, images:, :images] if attentions else None
    return out.logits[:, images:], maps
