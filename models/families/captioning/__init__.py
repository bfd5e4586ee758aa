"""Image captioning with attention, from Show, Attend and Tell to vision–language models (``model.py``): where every
image token came from (``geometry.py``), decoder-only VLMs' capture while generating and their attention sinks
(``vlm.py``), and whether a word's map is faithful (``explain.py``, its explanation adapter).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import ImageInput
from models.core.specs import ModelSpec
from models.families.captioning import explain, model

_MINI_DATA = ("this project's generated scenes: 1–3 coloured shapes on a 3 × 3 grid, captions from a small grammar "
              "(models/minis/captioning)")

SPECS = (
    ModelSpec("captioning", "mini Show, Attend and Tell", "mini", "captioning/show-attend-tell",
              "this project's licence", _MINI_DATA,
              "Xu et al. (2015): a CNN's 8 × 8 grid, an LSTM with additive attention; card: "
              "sample_data/captioning/show-attend-tell/card.md.", library="project"),
    ModelSpec("captioning", "mini encoder–decoder Transformer", "mini", "captioning/encoder-decoder",
              "this project's licence", _MINI_DATA,
              "ViT encoder (8 × 8 patches + [CLS]) and a GPT-2 decoder with cross-attention; card: "
              "sample_data/captioning/encoder-decoder/card.md."),
    ModelSpec("captioning", "mini decoder-only VLM (LLaVA-style)", "mini", "captioning/decoder-only",
              "this project's licence", _MINI_DATA,
              "LLaVA's architecture: the mini encoder–decoder's ViT (frozen), an MLP projector, 64 patch tokens "
              "before the caption in one causal Llama; card: sample_data/captioning/decoder-only/card.md."),
    ModelSpec("captioning", "SmolVLM-256M-Instruct", "hub", "HuggingFaceTB/SmolVLM-256M-Instruct", "Apache-2.0",
              "The Cauldron, Docmatix and other open image–text data (Marafioti et al. 2025)",
              "Idefics3 architecture: SigLIP (512 px tiles, 16 px patches) + 4 × 4 pixel shuffle → 64 tokens per "
              "tile plus a global thumbnail; SmolLM2-135M language model."),
    ModelSpec("captioning", "SmolVLM-500M-Instruct", "hub", "HuggingFaceTB/SmolVLM-500M-Instruct", "Apache-2.0",
              "The Cauldron, Docmatix and other open image–text data (Marafioti et al. 2025)",
              "Idefics3 architecture: SigLIP tiles + pixel shuffle; SmolLM2-360M language model."),
    ModelSpec("captioning", "LLaVA-1.5-7B", "hub", "llava-hf/llava-1.5-7b-hf", "Llama 2 Community Licence",
              "LLaVA's 558k captions + 665k visual instructions (Liu et al. 2023)",
              "CLIP ViT-L/14 at 336 px: 24 × 24 = 576 patch tokens ([CLS] dropped), Vicuna-7B; ~14 GB in float16."),
    ModelSpec("captioning", "Qwen2-VL-2B-Instruct", "hub", "Qwen/Qwen2-VL-2B-Instruct", "Apache-2.0",
              "Qwen2-VL's multimodal pre-training and instruction data (Wang et al. 2024)",
              "Dynamic resolution: 14 px patches merged 2 × 2 (one token per 28 px), M-RoPE; Qwen2-1.5B."),
    ModelSpec("captioning", "PaliGemma-3B-mix-224", "hub", "google/paligemma-3b-mix-224", "Gemma Terms of Use (gated)",
              "WebLI and a mixture of captioning and VQA tasks (Beyer et al. 2024)",
              "SigLIP So400m at 224 px: 16 × 16 = 256 image tokens, attended bidirectionally with the prompt (a "
              "prefix); Gemma-2B."),
)

FAMILY = Family("captioning", "image captioning with attention", ImageInput, model.load, model.run,
                model.CaptionResult,
                views=("caption_strip", "caption_word", "caption_candidates", "caption_heads", "caption_explanations",
                       "caption_faithfulness", "caption_sinks", "caption_regions",
                       "caption_architectures"),
                options=model.CaptionSettings,
                specs=SPECS,
                explainer=explain)
