"""The capture path is proven: maps equal transformers' own eager attention, masks are exact, nothing leaks."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from models.core import capture
from models.core.results import attention_probabilities
from tests.conftest import tiny_model

TOL = 1e-5


def _pair(kind: str):
    """The same weights loaded twice: with our capture function and with transformers' eager attention."""
    ours = tiny_model(kind, "capture")
    eager = tiny_model(kind, "eager")
    eager.load_state_dict(ours.state_dict())
    return ours, eager


def _eager_attentions(model, **inputs):
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    return out


def _compare(maps, reference, real_queries=None):
    assert maps.num_layers == len(reference)
    for layer in range(maps.num_layers):
        ours = maps.layer(layer)
        ref = reference[layer].float().numpy()
        if real_queries is not None:
            ours, ref = ours[:, real_queries], ref[:, real_queries]
        np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_causal_capture_equals_eager(kind):
    ours, eager = _pair(kind)
    ids = torch.randint(1000, 2000, (1, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture.recording(ours) as rec:
        logits = ours(input_ids=ids).logits
    ref = _eager_attentions(eager, input_ids=ids)
    _compare(rec.attention_maps("self"), [a[0] for a in ref.attentions])
    # the model still runs SDPA: its outputs are the eager model's outputs
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-4)


def test_gqa_keys_are_repeated_per_head():
    ours, eager = _pair("llama")
    assert ours.config.num_key_value_heads < ours.config.num_attention_heads
    ids = torch.randint(1000, 2000, (1, 9))
    with torch.no_grad(), capture.recording(ours) as rec:
        ours(input_ids=ids)
    maps = rec.attention_maps("self")
    assert maps.keys[0].shape[0] == ours.config.num_key_value_heads  # kept un-repeated: less memory
    assert maps.layer(0).shape[0] == ours.config.num_attention_heads
    _compare(maps, [a[0] for a in _eager_attentions(eager, input_ids=ids).attentions])


def test_causal_upper_triangle_and_padded_keys_are_exactly_zero():
    ours, eager = _pair("llama")
    ids = torch.randint(1000, 2000, (2, 8))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])  # left padding in item 0
    with torch.no_grad(), capture.recording(ours) as rec:
        ours(input_ids=ids, attention_mask=mask)
    ref = _eager_attentions(eager, input_ids=ids, attention_mask=mask)
    for item in range(2):
        maps = rec.attention_maps("self", item)
        real = mask[item].bool().numpy()
        _compare(maps, [a[item] for a in ref.attentions], real_queries=real)
        for layer in range(maps.num_layers):
            weights = maps.layer(layer)[:, real]  # real queries only
            assert np.all(weights[:, :, ~real] == 0.0), "padded keys must get exactly 0"
            upper = np.triu(np.ones((8, 8), dtype=bool), k=1)[real]
            assert np.all(weights[:, upper] == 0.0), "future keys must get exactly 0"
            np.testing.assert_allclose(weights.sum(-1), 1.0, atol=TOL)


def test_padding_can_be_dropped_from_results():
    ours, _ = _pair("llama")
    ids = torch.randint(1000, 2000, (1, 6))
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    with torch.no_grad(), capture.recording(ours) as rec:
        ours(input_ids=ids, attention_mask=mask)
    maps = rec.attention_maps("self", 0, query_positions=[1, 2, 3, 4, 5], key_positions=[1, 2, 3, 4, 5])
    assert maps.layer(1).shape == (4, 5, 5)
    np.testing.assert_allclose(maps.layer(1).sum(-1), 1.0, atol=TOL)


def test_bidirectional_encoder_with_padding():
    ours, eager = _pair("bert")
    ids = torch.randint(1000, 2000, (1, 7))
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    with torch.no_grad(), capture.recording(ours) as rec:
        ours(input_ids=ids, attention_mask=mask)
    maps = rec.attention_maps("self")
    real = mask[0].bool().numpy()
    _compare(maps, [a[0] for a in _eager_attentions(eager, input_ids=ids, attention_mask=mask).attentions], real)
    weights = maps.layer(0)[:, real]
    assert np.all(weights[:, :, ~real] == 0.0)
    assert np.all(weights[:, :, real] > 0.0), "an encoder has no causal mask"


def test_encoder_decoder_kinds_equal_eager():
    ours, eager = _pair("marian")
    src, tgt = torch.randint(1000, 2000, (1, 7)), torch.randint(1000, 2000, (1, 5))
    with torch.no_grad(), capture.recording(ours) as rec:
        ours(input_ids=src, decoder_input_ids=tgt)
    ref = _eager_attentions(eager, input_ids=src, decoder_input_ids=tgt)
    assert set(rec.kinds()) == {"encoder", "decoder", "cross"}
    _compare(rec.attention_maps("encoder"), [a[0] for a in ref.encoder_attentions])
    _compare(rec.attention_maps("decoder"), [a[0] for a in ref.decoder_attentions])
    cross = rec.attention_maps("cross")
    _compare(cross, [a[0] for a in ref.cross_attentions])
    assert cross.layer(0).shape == (4, 5, 7)  # target × source


def test_no_hooks_and_no_recorder_remain_even_after_an_error():
    model = tiny_model("gpt2")

    def hook_count():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    before = hook_count()
    with pytest.raises(RuntimeError, match="boom"):
        with capture.recording(model):
            raise RuntimeError("boom")
    assert capture._ACTIVE.get() is None
    with torch.no_grad(), capture.recording(model):
        model(input_ids=torch.tensor([[1000, 1001]]))
    assert hook_count() == before == 0
    assert capture._ACTIVE.get() is None
    assert not any(hasattr(m, "_capture") for m in model.modules())


def test_recording_refuses_a_model_that_would_record_nothing():
    with pytest.raises(ValueError, match="attn_implementation"):
        with capture.recording(tiny_model("gpt2", "sdpa")):
            pass


def test_outside_a_recording_nothing_is_kept():
    model = tiny_model("gpt2")
    with torch.no_grad():
        model(input_ids=torch.tensor([[1000, 1001, 1002]]))
    assert capture._ACTIVE.get() is None


def _run(model, ids):
    with torch.no_grad(), capture.recording(model) as rec:
        model(input_ids=torch.tensor([ids]))
    maps = rec.attention_maps("self")
    return [maps.layer(layer) for layer in range(maps.num_layers)]


def test_two_threads_on_one_model_each_get_their_own_result():
    model = tiny_model("llama")
    prompts = {"a": list(range(1000, 1012)), "b": list(range(2000, 2007))}
    alone = {name: _run(model, ids) for name, ids in prompts.items()}
    results, errors = {name: [] for name in prompts}, []
    barrier = threading.Barrier(2)

    def worker(name):
        try:
            barrier.wait()
            for _ in range(20):
                results[name].append(_run(model, prompts[name]))
        except Exception as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(name,)) for name in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for name in prompts:
        for layers in results[name]:
            for got, expected in zip(layers, alone[name]):
                assert np.array_equal(got, expected)


def test_attention_probabilities_matches_a_hand_computation():
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]], dtype=np.float32)  # (1 head, 2 queries, d=2)
    key = np.array([[[1.0, 0.0], [1.0, 1.0]]], dtype=np.float32)
    allowed = np.array([[True, False], [True, True]])
    weights = attention_probabilities(query, key, 1.0, allowed)
    # query 0 sees only key 0; query 1 scores (0, 1) -> softmax = (1, e) / (1 + e)
    np.testing.assert_allclose(weights[0], [[1.0, 0.0], [1 / (1 + np.e), np.e / (1 + np.e)]], atol=1e-7)


def test_long_input_keeps_queries_and_keys_not_maps():
    model = tiny_model("llama")
    n = 1024
    with torch.no_grad(), capture.recording(model) as rec:
        model(input_ids=torch.randint(1000, 2000, (1, n)))
    maps = rec.attention_maps("self")
    all_maps_bytes = maps.num_layers * maps.num_heads * n * n * 4
    assert maps.nbytes() < all_maps_bytes / 4
    assert maps.layer(1).shape == (4, n, n)


def test_a_cached_mask_keeps_its_id_from_passing_to_another_mask():
    """The recorder caches each mask's description by the mask's id: a mask freed while cached would let a later
    mask (a generation's next, wider one) take its id and be handed the old description. The cache holds the mask
    itself, so its id stays taken, and a look-up checks the mask is the same object."""
    import weakref

    import torch

    from models.core import capture

    recorder = capture.Recorder(module_names={})
    module = torch.nn.Module()
    first = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
    watch = weakref.ref(first)
    described = recorder._described(module, first, {}, 3, 3)
    del first
    assert watch() is not None  # still held by the cache: its id cannot be reused
    wider = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    rules = recorder._described(module, wider, {}, 1, 4)[0][0]
    assert rules.shape == (1, 4) and described[0][0].shape == (3, 3)


def test_longt5_local_blocks_unfold_to_the_map_that_makes_its_output():
    """LongT5's eager encoder attentions come block by block (each block's rows over its own and
    both neighbours' keys); unfolded to (q, k), they must be the weights that make the layer's own
    output, A @ V through its output projection, at a length that pads the last of three blocks."""
    import transformers

    config = transformers.LongT5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                       num_heads=4, local_radius=3, encoder_attention_type="local",
                                       decoder_start_token_id=0)
    torch.manual_seed(0)
    model = transformers.LongT5ForConditionalGeneration(config).eval()
    attention = model.encoder.block[0].layer[0].LocalSelfAttention
    seen = {}
    attention.register_forward_hook(
        lambda module, args, output: seen.update(input=args[0], output=output[0]))
    length = 10
    ids = torch.arange(1, length + 1)[None]
    with torch.inference_mode():
        output = model(input_ids=ids, decoder_input_ids=ids[:, :2], output_attentions=True)
    full = capture._unblock(output.encoder_attentions[0], length)
    assert full.shape == (1, 4, length, length)
    torch.testing.assert_close(full.sum(-1), torch.ones(1, 4, length))
    distance = (torch.arange(length)[:, None] - torch.arange(length)[None, :]).abs()
    assert float(full[..., distance > config.local_radius].abs().max()) == 0.0  # its band, no wider
    with torch.inference_mode():
        values = attention.v(seen["input"]).view(1, length, 4, 8).transpose(1, 2)
        made = attention.o((full @ values).transpose(1, 2).reshape(1, length, 32))
    torch.testing.assert_close(made, seen["output"], atol=1e-5, rtol=1e-5)
