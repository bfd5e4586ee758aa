"""The logit lens of the translator's decoder (models/analysis/lens.py ``decoder_logit_lens``): the last layer is
the run's own output distribution at every step, a middle layer equals that layer's output (hooked on its own)
through the LM head and its bias, the GRU refuses with a message, and the page shows it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models import families
from models.analysis import lens
from models.core.inputs import TextInput
from models.families import translation as family
from viz import figures
from viz.figures.lens import LensOptions


@pytest.fixture(scope="module")
def transformer():
    loaded = families.load(families.spec("translation", "mini Transformer en→fr"))
    sentence = list(family.samples().values())[1]
    return loaded, families.run(loaded, TextInput(sentence, 64))


def test_the_last_layer_is_the_runs_output_and_a_middle_layer_its_own(transformer):
    loaded, result = transformer
    steps = len(result.generation)
    found = lens.decoder_logit_lens(loaded, result, LensOptions(positions=steps))
    assert found.tokens == tuple(result.output.decoder_input_tokens) and found.positions == tuple(range(steps))
    model = loaded.model
    for step in result.generation:  # the output row is the distribution the run chose each token from
        top = int(np.argmax([c.probability for c in step.candidates]))
        assert found.top_probs[-1, step.position, 0] == pytest.approx(step.candidates[top].probability, rel=1e-4)
    # a middle layer by hand: that decoder layer's output, hooked, through the LM head plus the final-logits bias
    layers = model.model.decoder.layers
    middle = len(layers) // 2
    kept = {}
    handle = layers[middle - 1].register_forward_hook(lambda m, a, out: kept.setdefault("h", out[0] if isinstance(
        out, tuple) else out))
    try:
        output = result.output
        source = torch.tensor([output.source_ids])
        with torch.no_grad():
            model(input_ids=source, decoder_input_ids=torch.tensor([[model.config.decoder_start_token_id]
                                                                     + output.output_ids[:-1]]), use_cache=False)
    finally:
        handle.remove()
    logits = model.get_output_embeddings()(kept["h"][0]) + model.final_logits_bias[0]
    probabilities = logits.softmax(-1)
    np.testing.assert_allclose(found.top_probs[middle, :, 0], probabilities.max(-1).values.numpy(), rtol=1e-4)
    np.testing.assert_array_equal(found.top_ids[middle, :, 0], probabilities.argmax(-1).numpy())
    figure = figures.build("decoder_lens", found, LensOptions(positions=steps))
    assert "decoder-logit-lens" in figure.stem and len(figure.payload()["layers"]) == len(layers) + 1


def test_the_gru_has_no_decoder_layers_to_read():
    loaded = families.load(families.spec("translation", "mini GRU + additive attention en→fr"))
    result = families.run(loaded, TextInput(list(family.samples().values())[1], 64))
    with pytest.raises(ValueError, match="GRU"):
        lens.decoder_logit_lens(loaded, result, LensOptions())


def test_the_translation_page_shows_the_decoder_lens():
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app" / "views" / "translation.py"), default_timeout=120)
    at.query_params.update({"tr_view": "What each decoder layer predicts"})
    at.run()
    assert not at.exception, at.exception
    assert any("Layer 0 is the embeddings" in caption.value for caption in at.caption)
