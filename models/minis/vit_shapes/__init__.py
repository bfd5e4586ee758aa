"""The offline mini ViT: a small timm VisionTransformer trained here on generated shapes over photo backgrounds."""
