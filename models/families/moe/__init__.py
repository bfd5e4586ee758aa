"""Mixture-of-experts transformers: the router's choices per token and layer (``model.py``).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import TextInput
from models.core.specs import ModelSpec
from models.families.moe import model

SPECS = (
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
    ModelSpec("moe", "Mixtral-8x7B-v0.1", "hub", "mistralai/Mixtral-8x7B-v0.1", "Apache-2.0",
              "Mistral AI's web data (not disclosed)",
              "32 layers × 8 experts, top-2 (13B of 47B parameters active); ~94 GB in bfloat16: GPUs only, and the "
              "hub asks you to accept its terms first."),
)

FAMILY = Family("moe", "mixture-of-experts transformer", TextInput, model.load, model.run, model.RoutingResult,
                views=("routed_text", "expert_legend", "layer_strip", "gate", "load", "coactivation", "consistency",
                       "specialisation", "load_difference"),
                specs=SPECS)
