"""The offline mini DETR (models/minis/detr_shapes/train.py): boxes and classes of generated shapes."""
