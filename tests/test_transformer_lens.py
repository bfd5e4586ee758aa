"""Agreement with an independent implementation: TransformerLens (test-only dependency, requirements-dev.txt) wraps
the same tiny models in its own hook points; its residual stream through its final norm and unembedding must give
our logit lens, and its ``hook_z`` zeroed head by head must give our head ablation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models import families
from models.analysis import ablation, lens
from models.core.inputs import TextInput
from tests.conftest import save_tiny
from viz.figures.ablation import AblationOptions
from viz.figures.lens import LensOptions

TEXT = "the cat sat on the mat and the dog sat on the"


@pytest.fixture(scope="module", params=["llama"])  # SmolLM2's shape (RoPE, GQA); GPT-2 is checked by hand elsewhere
def both(request, tmp_path_factory):
    import transformer_lens  # noqa: F401  (declared in requirements-dev.txt)
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    with pytest.MonkeyPatch.context() as patch:
        folder = save_tiny(request.param, tmp_path_factory.mktemp("tl") / request.param)
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
        loaded = families.load(families.custom("causal_lm", str(folder)))
        result = families.run(loaded, TextInput(TEXT, 64))
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        bridge = TransformerBridge.boot_transformers(str(folder), hf_model=hf, tokenizer=loaded.tokenizer,
                                                     device="cpu")
        yield loaded, result, bridge, torch.tensor([list(result.token_ids)])


def test_logit_lens_agrees_with_transformer_lens(both):
    loaded, result, bridge, ids = both
    found = lens.logit_lens(loaded, result, LensOptions(positions=len(result.tokens)))
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(ids)
        layers = bridge.cfg.n_layers
        streams = [cache["blocks.0.hook_resid_pre"]] + [cache[f"blocks.{l}.hook_resid_post"] for l in range(layers)]
        probabilities = [bridge.unembed(bridge.ln_final(stream))[0].softmax(-1) for stream in streams]
    assert found.num_layers == layers
    final = probabilities[-1].argmax(-1)
    np.testing.assert_array_equal(found.final_ids, final.numpy())
    torch.testing.assert_close(probabilities[-1], logits[0].softmax(-1))
    for layer, reference in enumerate(probabilities):
        np.testing.assert_allclose(found.final_probs[layer], reference[torch.arange(len(final)), final].numpy(),
                                   rtol=1e-3, atol=1e-6)
        np.testing.assert_allclose(found.top_probs[layer, :, 0], reference.max(-1).values.numpy(), rtol=1e-3,
                                   atol=1e-6)


def test_head_ablation_agrees_with_transformer_lens(both):
    loaded, result, bridge, ids = both
    found = ablation.head_ablation(loaded, result, AblationOptions())
    target = found.target_id

    def logprob(hooks) -> float:
        with torch.no_grad():
            logits = bridge.run_with_hooks(ids, fwd_hooks=hooks)
        return float(logits[0, -1].log_softmax(-1)[target])

    clean = logprob([])
    assert found.clean_logprob == pytest.approx(clean, abs=1e-4)
    for layer in range(found.num_layers):
        for head in range(found.num_heads):
            def zero(z, hook, head=head):  # z: (batch, position, head, d_head)
                z = z.clone()
                z[:, :, head] = 0
                return z

            expected = logprob([(f"blocks.{layer}.attn.hook_z", zero)]) - clean
            assert found.effect[layer, head] == pytest.approx(expected, abs=2e-4), (layer, head)
    assert np.abs(found.effect).max() > 1e-3
