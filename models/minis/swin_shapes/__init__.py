"""The offline mini Swin: a small timm SwinTransformer trained here on generated coloured shapes."""
