"""timm capture equals an independent eager computation, leaves no hooks behind, and keeps threads apart."""
import threading

import numpy as np
import pytest
import timm
import torch

from models.core import capture_timm


def tiny_vit(reg_tokens: int = 0, seed: int = 0):
    torch.manual_seed(seed)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=3,
                              num_heads=2, embed_dim=16, num_classes=5, reg_tokens=reg_tokens).eval()
    capture_timm.disable_fused_attention(model)
    return model


def eager_reference(model, pixels: torch.Tensor) -> list[np.ndarray]:
    """softmax(q kᵀ/√d) per block, computed by hand from the block's inputs (no hooks, no timm attention code)."""
    maps = []
    with torch.no_grad():
        x = model.patch_embed(pixels)
        x = model._pos_embed(x)
        x = model.norm_pre(x)
        for block in model.blocks:
            attn = block.attn
            h = block.norm1(x)
            B, N, C = h.shape
            qkv = h @ attn.qkv.weight.T + attn.qkv.bias  # (B, N, 3C)
            q, k, _ = qkv.reshape(B, N, 3, attn.num_heads, C // attn.num_heads).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-2, -1)) / (C // attn.num_heads) ** 0.5  # (B, heads, N, N)
            maps.append(scores.softmax(-1)[0].numpy())
            x = block(x)
    return maps


@pytest.mark.parametrize("reg_tokens", [0, 4])
def test_capture_equals_eager_reference(reg_tokens):
    model = tiny_vit(reg_tokens)
    pixels = torch.randn(1, 3, 32, 32)
    output, layers = capture_timm.vit_attention(model, pixels)
    reference = eager_reference(model, pixels)
    assert len(layers) == 3 and layers[0].shape == (2, 1 + reg_tokens + 16, 1 + reg_tokens + 16)
    for captured, expected in zip(layers, reference):
        np.testing.assert_allclose(captured, expected, atol=1e-6)
        np.testing.assert_allclose(captured.sum(-1), 1.0, atol=1e-5)
    # turning fused attention off changed nothing but the path: a fused twin gives the same logits
    fused = tiny_vit(reg_tokens)
    for module in fused.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = True
    with torch.no_grad():
        torch.testing.assert_close(fused(pixels), output, atol=1e-5, rtol=1e-5)


def test_fused_module_is_refused_and_flag_is_per_module():
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                              num_heads=2, embed_dim=16, num_classes=5)
    if any(getattr(m, "fused_attn", False) for m in model.modules()):
        with pytest.raises(ValueError, match="disable_fused_attention"):
            capture_timm.attention_points(model)
    other = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                              num_heads=2, embed_dim=16, num_classes=5)
    capture_timm.disable_fused_attention(model)
    assert not model.blocks[0].attn.fused_attn
    assert other.blocks[0].attn.fused_attn == timm.layers.use_fused_attn()  # no global switch was flipped


def test_hooks_are_removed_even_when_forward_fails():
    model = tiny_vit()
    points = capture_timm.attention_points(model)
    calls = []

    def keep_then_fail(output):  # fails inside the forward, after the first hook has run
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return output

    with pytest.raises(RuntimeError, match="boom"):
        with capture_timm.recording(model, points, keep=keep_then_fail):
            model(torch.randn(1, 3, 32, 32))
    assert all(not module._forward_hooks for _, module in points)
    capture_timm.vit_attention(model, torch.randn(1, 3, 32, 32))
    assert all(not module._forward_hooks for _, module in points)


def test_two_threads_on_one_model_do_not_mix():
    model = tiny_vit()
    inputs = [torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    expected = [capture_timm.vit_attention(model, x)[1] for x in inputs]
    results: dict[int, list] = {}

    def work(index: int):
        for _ in range(15):
            _, layers = capture_timm.vit_attention(model, inputs[index])
            for got, want in zip(layers, expected[index]):
                if not np.allclose(got, want, atol=1e-6):
                    results[index] = "mixed"
                    return
        results[index] = "ok"

    def plain_forwards():  # unhooked forwards from a third thread must not leak into recordings
        with torch.no_grad():
            for _ in range(30):
                model(inputs[1])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)] + [threading.Thread(target=plain_forwards)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: "ok", 1: "ok"}


def test_stored_attention_contract():
    model = tiny_vit()
    _, layers = capture_timm.vit_attention(model, torch.randn(1, 3, 32, 32))
    tokens = ["[CLS]"] + [f"patch {i}" for i in range(16)]
    maps = capture_timm.stored_attention(layers, tokens)
    assert maps.num_layers == 3 and maps.num_heads == 2 and maps.layer(1).dtype == np.float32
    with pytest.raises(ValueError, match="token names"):
        capture_timm.stored_attention(layers, tokens[:-1])
