"""The offline mini MLP-Mixer (models/minis/mixer_shapes/train.py), trained on the mini ViT's shapes."""
