"""DETR: object detection with a Transformer decoder whose object queries attend to the image (``model.py``).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import ImageInput
from models.core.specs import ModelSpec
from models.families.detr import model

SPECS = (
    ModelSpec("detr", "mini DETR shapes", "mini", "detr_shapes", "this project's licence",
              "this project's generated scenes of 1–3 coloured shapes with their boxes (models/minis/detr_shapes)",
              "6 classes; 64 px input, ResNet stride 8 → 8 × 8 image tokens, 2 encoder + 3 decoder layers, 8 object "
              "queries; measured box AP in sample_data/detr_shapes/card.md."),
    ModelSpec("detr", "detr-resnet-50", "hub", "facebook/detr-resnet-50", "Apache-2.0",
              "COCO 2017 detection, 91 classes (Carion et al. 2020)",
              "DETR-R50: 6 + 6 layers, 8 heads, 100 object queries; run here at 512 × 512 px (16 × 16 image tokens). "
              "Needs timm for its ResNet-50 backbone."),
)

FAMILY = Family("detr", "DETR: object detection with a Transformer decoder", ImageInput, model.load,
                model.run, model.DetrResult,
                views=("detr_queries", "detr_query", "detr_boxes"),
                specs=SPECS)
