"""Swin Transformers (timm v1 and v2): windows, shifted-window masks, relative position bias (``model.py``);
transformers' Swin, Swin v2, Donut's and MaskFormer's Swins typed in (``hf.py``); the window geometry
(``geometry.py``); the explanation adapter (``explain.py``).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import ImageInput
from models.core.specs import ModelSpec
from models.families.swin import explain, model

SPECS = (
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
)

FAMILY = Family("swin", "Swin Transformer (timm or transformers)", ImageInput, model.load, model.run, model.SwinResult,
                views=("hierarchy", "stage_windows", "patch_merging", "cyclic_shift", "shifted_window_masks",
                       "relative_position_bias", "window_attention", "block_windows", "patch_attention", "window_cost",
                       "swin_predictions", "faithfulness", "explanations", "attribution"),
                specs=SPECS,
                explainer=explain)
