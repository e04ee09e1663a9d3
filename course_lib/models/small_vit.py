"""Vision Transformers sized for 64 px tiles, for notebook 12's model-family comparison: DeiT-Tiny's widths (Touvron et
al. 2021, "Training data-efficient image transformers", arXiv:2012.12877: embedding 192, 12 blocks of 3 heads).
`vit_tiny_patch8_64` cuts a 64 px tile into 8 px patches (64 tokens, 5,390,410 parameters with 10 classes);
`vit_tiny_patch16_64` into timm's usual 16 px patches (a 4x4 grid of 16 tokens, about 4x less arithmetic, 5,491,786
parameters), the one a 2-core CPU can train in the cpu profile. Registered with timm, so
`timm.create_model("vit_tiny_patch8_64", num_classes=10)` works wherever `course_lib.models` was imported
(`tests/test_model_family.py` checks the numbers). `dynamic_img_size` interpolates the position embedding, so
progressive resizing (32 px early epochs) works. No pretrained weights exist.
"""
from __future__ import annotations

from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer


def _deit_tiny(name: str, patch_size: int, pretrained: bool, kwargs: dict) -> VisionTransformer:
    if pretrained:
        raise ValueError(f"{name} has no pretrained weights; set pretrained=false")
    # timm's create_model passes its pretrained-config entries; a model without weights has no use for them.
    kwargs = {key: value for key, value in kwargs.items() if not key.startswith("pretrained_cfg") and key != "cache_dir"}
    settings = dict(img_size=64, patch_size=patch_size, embed_dim=192, depth=12, num_heads=3, dynamic_img_size=True)
    model = VisionTransformer(**{**settings, **kwargs})
    model.pretrained_cfg = model.default_cfg = {
        "url": "", "num_classes": 1000, "input_size": (3, 64, 64), "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225), "first_conv": "patch_embed.proj", "classifier": "head", "architecture": name}
    return model


@register_model
def vit_tiny_patch8_64(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-Tiny widths, 8 px patches, 64 px input (64 tokens and a class token)."""
    return _deit_tiny("vit_tiny_patch8_64", 8, pretrained, kwargs)


@register_model
def vit_tiny_patch16_64(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-Tiny widths, 16 px patches, 64 px input (16 tokens and a class token)."""
    return _deit_tiny("vit_tiny_patch16_64", 16, pretrained, kwargs)
