"""MLP-Mixer (timm): token-mixing MLPs in place of attention (``model.py``).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import ImageInput
from models.core.specs import ModelSpec
from models.families.mixer import model

SPECS = (
    ModelSpec("mixer", "mini Mixer shapes", "mini", "mixer_shapes", "this project's licence",
              "this project's generated shapes on crops of the CC0 sample photos (the mini ViT's data)",
              "6 classes, the mini ViT's 8 × 8 grid of 8 px patches at 64 px; 6 blocks, token MLP 64 → 32 → 64; "
              "measured accuracy in sample_data/mixer_shapes/card.md.", library="timm"),
    ModelSpec("mixer", "mixer_b16_224", "hub", "mixer_b16_224", "Apache-2.0",
              "ImageNet-21k, fine-tuned on ImageNet-1k (Tolstikhin et al. 2021)",
              "Mixer-B/16: 12 blocks, 14 × 14 = 196 patches, token MLP 196 → 384 → 196.", library="timm"),
)

FAMILY = Family("mixer", "MLP-Mixer (timm): token-mixing MLPs instead of attention", ImageInput,
                model.load, model.run, model.MixerResult,
                views=("mixing", "mixing_matrix", "predictions"),
                specs=SPECS)
