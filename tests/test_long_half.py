"""Long inputs keep q/k in float16 (half the bytes) and still recompute each head in float32 close to eager."""
from __future__ import annotations

import numpy as np
import torch

from models.core import capture


def test_beyond_the_threshold_q_and_k_are_half_precision_and_the_maps_stay_close(monkeypatch):
    import transformers

    monkeypatch.setattr(capture, "HALF_PRECISION_TOKENS", 256)  # the same path as 8,192 tokens, at test size
    capture.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="capture").eval()
    ids = torch.randint(0, 500, (1, 600))
    with torch.inference_mode(), capture.recording(model) as recorder:
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
    maps = recorder.attention_maps("self")
    assert all(a.dtype == torch.float16 and a.device.type == "cpu" for a in maps.queries + maps.keys)
    assert sum(a.nbytes for a in maps.queries + maps.keys) == 2 * (4 + 2) * 600 * 8 * 2  # layers·(H+H_kv)·n·d·2 B
    model.set_attn_implementation("eager")
    with torch.inference_mode():
        eager = model(input_ids=ids, use_cache=False, output_attentions=True).attentions
    for layer in range(2):
        weights = maps.layer(layer)
        assert weights.dtype == np.float32
        np.testing.assert_allclose(weights.sum(-1), 1, atol=1e-5)
        np.testing.assert_allclose(weights, eager[layer][0].numpy(), atol=2e-3)  # float16 q/k: ~1e-3
        np.testing.assert_allclose(maps.head(layer, 3), eager[layer][0, 3].numpy(), atol=2e-3)


def test_short_inputs_and_out_of_range_values_stay_float32():
    small = torch.randn(1, 2, 10, 4)
    assert capture._compact_copy(small).dtype == torch.float32
    assert not capture._fits_half(torch.full((2, 2), 70000.0))
    assert not capture._fits_half(torch.ones(2, dtype=torch.bfloat16))
    assert capture._fits_half(torch.ones(2))
