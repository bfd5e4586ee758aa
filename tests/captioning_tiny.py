"""Tiny random vision–language models of each hub architecture the captioning page reads (SmolVLM/Idefics3, LLaVA,
Qwen2-VL, PaliGemma), saved with their processors to a folder so the tests load them through exactly the code a hub
id takes. Sizes are as small as each architecture allows; geometry settings (patch, tile, merge, shuffle) keep the
shape of the real models at a fraction of the pixels."""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = ("a", "the", "photo", "of", "cat", "dog", "red", "blue", "caption", "describe", "image", "this", "en",
         "User:", "Assistant:", "USER:", "ASSISTANT:", "is", "on", "in", "and")


def tokenizer(specials: list[str], bos: str = "<s>", eos: str = "</s>", pad: str = "<pad>"):
    """A word-level ``PreTrainedTokenizerFast`` whose specials are split out before whitespace splitting."""
    from transformers import PreTrainedTokenizerFast

    base = [pad, bos, eos, "<unk>"]
    vocab = {word: i for i, word in enumerate(dict.fromkeys([*base, *specials, *WORDS]))}
    pipeline = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    pipeline.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    made = PreTrainedTokenizerFast(tokenizer_object=pipeline, bos_token=bos, eos_token=eos, pad_token=pad,
                                   unk_token="<unk>", model_max_length=100_000)
    made.add_special_tokens({"additional_special_tokens": list(specials)})
    return made


def _text(vocab: int, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, **extra)


def smolvlm(folder: Path, tile: int = 64, patch: int = 8, scale: int = 2, longest: int = 192) -> Path:
    """SmolVLM (Idefics3 family): tiles of ``tile`` px, ``patch`` px patches, ``scale`` × ``scale`` pixel shuffle;
    the longest edge resized to ``longest`` (3 tiles across, as SmolVLM-256M's 2048 / 512 = 4)."""
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    specials = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
                *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]]
    tok = tokenizer(specials)
    seq = (tile // patch // scale) ** 2
    config = SmolVLMConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": tile, "patch_size": patch},
        text_config=_text(len(tok)).to_dict(), scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    SmolVLMForConditionalGeneration(config).save_pretrained(folder)
    processor = SmolVLMProcessor(SmolVLMImageProcessor(size={"longest_edge": longest},
                                                       max_image_size={"longest_edge": tile}),
                                 tok, SmolVLMVideoProcessor(), image_seq_len=seq)
    processor.save_pretrained(folder)
    return folder


def llava(folder: Path, side: int = 56, patch: int = 14, pad: bool = False) -> Path:
    """LLaVA-1.5's shape: a CLIP vision tower at ``side`` px (shortest edge resized, centre crop), the penultimate
    layer's patch tokens with [CLS] dropped."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaImageProcessor,
        LlavaProcessor,
    )

    tok = tokenizer(["<image>"])
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=side, patch_size=patch, projection_dim=32)
    config = LlavaConfig(vision_config=vision, text_config=_text(len(tok)), image_token_id=tok.convert_tokens_to_ids(
        "<image>"), vision_feature_layer=-2, vision_feature_select_strategy="default",
        image_seq_length=(side // patch) ** 2, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(folder)
    processor_class = LlavaImageProcessor if pad else CLIPImageProcessor
    image_processor = processor_class(size={"shortest_edge": side}, crop_size={"height": side, "width": side},
                                      **({"do_pad": True} if pad else {}))
    LlavaProcessor(image_processor, tok, patch_size=patch, vision_feature_select_strategy="default",
                   num_additional_image_tokens=1, image_token="<image>").save_pretrained(folder)
    return folder


def qwen2_vl(folder: Path, patch: int = 14, merge: int = 2, max_pixels: int = 112 * 84) -> Path:
    """Qwen2-VL's shape: dynamic resolution (smart resize to multiples of 28, at most ``max_pixels``), 2 × 2
    merges, M-RoPE."""
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = tokenizer(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    text = {"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
            "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}}
    config = Qwen2VLConfig(
        vision_config={"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2,
                       "patch_size": patch, "spatial_merge_size": merge, "temporal_patch_size": 2},
        text_config=text, image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"))
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(config).save_pretrained(folder)
    image_processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=max_pixels, patch_size=patch,
                                            merge_size=merge)
    Qwen2VLProcessor(image_processor, tok, Qwen2VLVideoProcessor()).save_pretrained(folder)
    return folder


def paligemma(folder: Path, side: int = 56, patch: int = 14) -> Path:
    """PaliGemma's shape: SigLIP at ``side`` px (resized to a square), the image tokens and the prompt a prefix
    attended bidirectionally."""
    from transformers import (
        GemmaConfig,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    tok = tokenizer(["<image>"], bos="<bos>", eos="<eos>")
    tokens = (side // patch) ** 2
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=side, patch_size=patch, projection_dim=32)
    text = GemmaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=4096)
    config = PaliGemmaConfig(vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids(
        "<image>"), projection_dim=32, hidden_size=32)
    config.vision_config.num_image_tokens = tokens
    torch.manual_seed(0)
    PaliGemmaForConditionalGeneration(config).save_pretrained(folder)
    image_processor = SiglipImageProcessor(size={"height": side, "width": side})
    image_processor.image_seq_length = tokens
    PaliGemmaProcessor(image_processor, tok).save_pretrained(folder)
    return folder


BUILDERS = {"smolvlm": smolvlm, "llava": llava, "qwen2_vl": qwen2_vl, "paligemma": paligemma}


def minis(root: Path) -> dict[str, Path]:
    """The three captioning minis' architectures at a tiny size, untrained, saved as the trainer saves them."""
    from models.minis.captioning import architectures, train, vocabulary
    from models.minis.captioning.show_attend_tell import (
        ShowAttendTell,
        ShowAttendTellConfig,
    )

    sizes = architectures.TransformerSizes(width=32, encoder_layers=2, decoder_layers=2, heads=2, mlp=64)
    torch.manual_seed(0)
    sat = ShowAttendTell(ShowAttendTellConfig(vocab_size=len(vocabulary.WORDS), channels=(8, 8, 16), feature_dim=16,
                                              embed_dim=16, hidden_dim=32, attention_dim=16)).eval()
    encoder_decoder = architectures.build_encoder_decoder(sizes).eval()
    decoder_only = architectures.build_decoder_only(sizes, architectures.encoder_state(encoder_decoder)).eval()
    folders = {}
    for name, model in (("show-attend-tell", sat), ("encoder-decoder", encoder_decoder),
                        ("decoder-only", decoder_only)):
        train.save(name, model, root / name)
        folders[name] = root / name
    return folders


def mini_spec(spec, folder: Path):
    """``spec`` (a declared mini) pointing at ``folder`` instead of sample_data."""
    import dataclasses

    return dataclasses.replace(spec, id=str(folder))
