"""One convention for stepping through generated tokens (issue 28), on the GPT page and the translation page: step t
shows the attention row of the position whose distribution chose token t (the position before it, whose input was
the previous token), beside that distribution, and says so. The GPT page used to show the chosen token's own row
("where 'Paris' looked", Paris among the keys) beside the distribution of the position before it."""
from __future__ import annotations

import numpy as np
import pytest

from models import families
from models.core.inputs import TextInput
from models.core.results import STEP_CONVENTION
from models.core.specs import ModelSpec
from viz import figures


def part(figure, name: str):
    """A figure's payload or arrays, whether given as a value or as a function that makes it."""
    value = getattr(figure, name)
    return value() if callable(value) else value


@pytest.fixture(scope="module")
def generated(tiny_folders):
    from models.families.causal_lm.model import GenerationSettings

    tiny = families.load(ModelSpec("causal_lm", "tiny", "hub", str(tiny_folders["llama"]), "test", "random"))
    return families.run(tiny, TextInput("the cat sat on the", 64), GenerationSettings(max_new_tokens=4))


@pytest.mark.parametrize("step", [1, 3])
def test_gpt_step_shows_the_row_that_chose_the_token(generated, step):
    from viz.figures.attention import StepOptions

    chosen = generated.generation[step - 1]
    position = generated.tokens.index(chosen.token, generated.prompt_length - 1 + step - 1)
    assert position == generated.prompt_length + step - 1  # the chosen token's own place in the text
    figure = figures.build("generation_step", generated, StepOptions(1, 2, step))
    expected = generated.maps("self").head(1, 2)[position - 1, :position]  # the previous position's row
    payload = part(figure, "payload")
    np.testing.assert_allclose(payload["weights"], expected, atol=1e-6)
    assert list(payload["key_tokens"]) == list(generated.tokens[:position])  # the chosen token is not a key yet
    assert STEP_CONVENTION in figure.caption


def test_translation_step_shows_the_row_that_chose_the_token():
    from viz.figures.translation import DecodingStepOptions

    loaded = families.load(families.spec("translation", "mini Transformer en→fr"))
    result = families.run(loaded, TextInput("The agreement on the European Economic Area was signed in August 1992."))
    step = 4
    figure = figures.build("decoding_step", result, DecodingStepOptions(step, 1, None))
    decoder = result.maps("decoder")
    row = next(r for r, token in enumerate(decoder.query_tokens) if r == step - 1)
    # the row's input is the word before the chosen one: the decoder position that chose it
    assert decoder.query_tokens[row] == result.output.output_tokens[step - 2]
    np.testing.assert_allclose(part(figure, "arrays")["source_attention"], result.maps("cross").head(1, None)[row], atol=1e-6)
    assert STEP_CONVENTION in figure.caption
