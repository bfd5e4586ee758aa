"""Head roles (models/analysis/roles.py) and the heads table (viz/figures/attention.py): the scores equal a direct
count on eager attention maps of the same repeated random tokens, the table holds roles and key/value groups, and a
role asked of a model that has none is a message."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models import families
from models.analysis import heads, roles
from models.core.inputs import TextInput
from tests.conftest import save_tiny
from viz import figures
from viz.figures.attention import GridOptions, StatisticsOptions


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny(request, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        folder = save_tiny(request.param, tmp_path_factory.mktemp("roles") / request.param)
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
        loaded = families.load(families.custom("causal_lm", str(folder)))
        yield folder, loaded, families.run(loaded, TextInput("the cat sat on the mat and the dog sat on the", 64))


def eager_scores(folder, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The four scores counted position by position from the weights transformers' eager attention returns."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        maps = model(input_ids=torch.from_numpy(ids), output_attentions=True).attentions  # layers × (B, H, T, T)
    n = (ids.shape[1] - 1) // 2
    out = {name: np.zeros((len(maps), maps[0].shape[1])) for name in roles.ROLES}
    for layer, weights in enumerate(maps):
        for head in range(weights.shape[1]):
            prev, ind, dup, sink = [], [], [], []
            for b in range(ids.shape[0]):
                a = weights[b, head].numpy()
                prev += [a[q, q - 1] for q in range(2, 2 * n + 1)]
                for q in range(n + 1, 2 * n + 1):
                    earlier = q - n  # the same token in the first copy
                    assert ids[b, earlier] == ids[b, q]
                    dup.append(a[q, earlier])
                    ind.append(a[q, earlier + 1])
                sink += [a[q, 0] for q in range(2 * n + 1)]
            for name, values in zip(roles.ROLES, (prev, ind, dup, sink)):
                out[name][layer, head] = np.mean(values)
    return out


def test_role_scores_equal_a_direct_count_on_eager_maps(tiny):
    folder, loaded, _ = tiny
    found = roles.head_roles(loaded)
    ids = found.sequence_ids
    assert ids.shape == (roles.SEQUENCES, 1 + 2 * roles.REPEAT_LENGTH)
    np.testing.assert_array_equal(ids[:, 1:1 + roles.REPEAT_LENGTH], ids[:, 1 + roles.REPEAT_LENGTH:])
    assert all(len(set(row[1:1 + roles.REPEAT_LENGTH])) == roles.REPEAT_LENGTH for row in ids)  # no repeat inside R
    expected = eager_scores(folder, ids)
    for name in roles.ROLES:
        np.testing.assert_allclose(found.scores[name], expected[name], atol=1e-5, err_msg=name)
    assert found.scores["sink"].min() > 0 and found.scores["induction"].max() < 1


def test_an_induction_pattern_scores_as_induction():
    """Hand-made maps: one head attends to the token after the earlier occurrence, one to the previous token."""
    n = 5
    total = 1 + 2 * n
    weights = np.zeros((1, 3, total, total))
    for q in range(total):
        weights[0, 0, q, q - n + 1 if q > n else 0] = 1  # induction
        weights[0, 1, q, max(q - 1, 0)] = 1  # previous token
        weights[0, 2, q, q - n if q > n else 0] = 1  # duplicate token
    scores = roles.role_scores(weights, n)
    np.testing.assert_allclose(scores["induction"], [1, 0, 0])
    np.testing.assert_allclose(scores["previous_token_role"], [0, 1, 0])
    np.testing.assert_allclose(scores["duplicate_token"], [0, 0, 1])
    with pytest.raises(ValueError, match="do not hold"):
        roles.role_scores(weights, n + 1)


def test_the_heads_table_has_roles_and_kv_groups(tiny):
    _, loaded, result = tiny
    summary = heads.summarize_run(loaded, result, StatisticsOptions())
    found = roles.head_roles(loaded)
    table = figures.build("head_statistics", summary, StatisticsOptions(statistic="induction")).table()
    np.testing.assert_allclose(table[roles.ROLES["induction"]], found.scores["induction"].ravel(), atol=1e-6)
    config = loaded.model.config
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if kv < config.num_attention_heads:
        group = config.num_attention_heads // kv
        assert list(table["kv group"]) == [h // group for h in table["head"]]
        assert summary.group_size == group
        assert "key/value groups" in figures.build("head_statistics", summary).caption
        assert "kv" in figures.build("grid", summary, GridOptions()).caption
    else:
        assert "kv group" not in table.columns and summary.group_size == 1
    assert list(table["layer"] * config.num_attention_heads + table["head"]) == list(range(len(table)))  # row = pick


def test_a_role_of_a_model_without_roles_is_a_message(tiny):
    _, loaded, result = tiny
    summary = heads.summarize_run(None, result, StatisticsOptions())  # no model: no random-token run
    assert summary.roles == {}
    with pytest.raises(ValueError, match="causal language models only"):
        figures.build("head_statistics", summary, StatisticsOptions(statistic="induction"))
    with pytest.raises(ValueError, match="unknown statistic"):
        figures.build("head_statistics", summary, StatisticsOptions(statistic="inductive"))
