"""Swin explanations (issue 17) against independent computations on a tiny random timm Swin (32 px, 8 × 8 → 4 × 4
tokens, a shifted block): the window maps carried back to the grid equal a dense matrix placed by hand (roll undone
by hand) and reproduce the block's own attention output; rollout through windows and merges equals a brute-force
product; gradient rollout with ones is 2^L × rollout; Grad-CAM on the last stage equals one done by hand; raw
attention reads the chosen layer and head; bad input gets a message. Then the packaged mini Swin through the CLI and
the page."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from models.analysis import attribution, relevance
from models.analysis.methods import METHODS, SHARED
from models.core import capture_timm
from models.families.swin import explain as swin_explain

SIZE, PATCH, WINDOW = 32, 4, 4


@pytest.fixture(scope="module")
def tiny():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=SIZE, window_size=WINDOW,
                              embed_dim=16, depths=(2, 2), num_heads=(2, 4), num_classes=5)
    capture_timm.disable_fused_attention(model)
    return SimpleNamespace(model=model.eval(), device="cpu")


@pytest.fixture(scope="module")
def crop():
    rng = np.random.default_rng(3)
    image = rng.integers(0, 60, (SIZE, SIZE, 3), dtype=np.uint8)
    image[8:20, 12:28] = (230, 40, 40)  # something for the classes to be about
    return image


@pytest.fixture(scope="module")
def ex(tiny, crop):
    return swin_explain.explainable(tiny, crop, [f"c{i}" for i in range(5)], target=2)


def by_hand_dense(windows: torch.Tensor, block) -> torch.Tensor:
    """Place each window's (…, Nw, Nw) map at its tokens' original positions: window w, position a sits at rolled
    (row, col) = (w // nWc · M + a // M, w % nWc · M + a % M); the roll by −s is undone by adding s modulo the grid."""
    height, width = block.input_resolution
    m, shift = block.window_size[0], block.shift_size[0]
    per_row = width // m
    out = torch.zeros(*windows.shape[1:-2], height * width, height * width)

    def original(w: int, a: int) -> int:
        row, col = w // per_row * m + a // m, w % per_row * m + a % m
        return (row + shift) % height * width + (col + shift) % width

    for w in range(windows.shape[0]):
        for a in range(m * m):
            for b in range(m * m):
                out[..., original(w, a), original(w, b)] = windows[w, ..., a, b]
    return out


def recorded(ex):
    with torch.no_grad(), ex.record() as layers:
        ex.logits(ex.embeddings)
    return layers


def test_window_maps_carried_back_equal_a_dense_matrix_built_by_hand(tiny, ex):
    blocks = swin_explain.blocks(tiny.model)
    layers = recorded(ex)
    assert [b.shift_size[0] for b in blocks] == [0, 2, 0, 0]  # the shifted block is checked, not only plain ones
    for index, (block, record) in enumerate(zip(blocks, layers)):
        windows = record.attention[:ex.layout.windows(index)]  # (nW, H, Nw, Nw)
        carried = ex.layout.to_grid(index, windows)  # (H, N, N)
        torch.testing.assert_close(carried, by_hand_dense(windows, block))
        torch.testing.assert_close(carried.sum(-1), torch.ones_like(carried.sum(-1)), atol=1e-5, rtol=0)


def test_the_dense_map_reproduces_the_blocks_attention_output(tiny, ex):
    """The carried-back map times each token's value, in original token order, is what the block's shifted-window
    attention computes (after its roll back): a check that needs no geometry at all."""
    block = swin_explain.blocks(tiny.model)[1]  # the shifted block of stage 1
    layers = recorded(ex)
    with torch.no_grad():
        grid_input = tiny.model.layers[0].blocks[0](ex.embeddings.reshape(1, 8, 8, -1))  # the block's input
        normed = block.norm1(grid_input)
        expected = block._attn(normed).reshape(64, -1)  # (N, C), roll undone by the block
        heads = block.attn.num_heads
        v = block.attn.qkv(normed.reshape(64, -1)).reshape(64, 3, heads, -1)[:, 2].transpose(0, 1)  # (H, N, hd)
        dense = ex.layout.to_grid(1, layers[1].attention[:ex.layout.windows(1)])  # (H, N, N)
        mixed = (dense @ v).transpose(0, 1).reshape(64, -1)
        torch.testing.assert_close(block.attn.proj(mixed), expected, atol=1e-5, rtol=1e-4)


def test_merges_follow_the_models_patch_merging(tiny):
    """Which fine tokens each coarse token reads, from the gradient of the real PatchMerging, is the merge matrix."""
    merge = tiny.model.layers[1].downsample
    x = torch.randn(1, 8, 8, 16, requires_grad=True)
    out = merge(x)  # (1, 4, 4, 32)
    reads = torch.zeros(16, 64)
    for coarse in range(16):
        grad, = torch.autograd.grad(out.reshape(16, -1)[coarse].sum(), x, retain_graph=True)
        reads[coarse] = (grad[0].abs().sum(-1).reshape(-1) > 0).float()
    layout = swin_explain.layout(tiny.model)
    assert list(layout.merges) == [2]
    torch.testing.assert_close(layout.merges[2], reads / 4)


def test_rollout_through_windows_and_merges_equals_a_brute_force_product(tiny, ex):
    blocks = swin_explain.blocks(tiny.model)
    layers = recorded(ex)
    product = None  # R maps first-grid tokens to the current layer's tokens
    for index, (block, record) in enumerate(zip(blocks, layers)):
        dense = by_hand_dense(record.attention[:ex.layout.windows(index)].mean(1), block)
        step = 0.5 * dense + 0.5 * torch.eye(len(dense))
        if product is not None and len(dense) != product.shape[0]:  # 8 × 8 -> 4 × 4: each token averages its 2 × 2
            merge = torch.zeros(16, 64)
            for r in range(4):
                for c in range(4):
                    for a in range(2):
                        for b in range(2):
                            merge[r * 4 + c, (2 * r + a) * 8 + 2 * c + b] = 0.25
            product = merge @ product
        product = step if product is None else step @ product
    expected = product.mean(0)  # the head's mean over the last stage's tokens
    found = attribution.explain(ex, ("rollout", "raw_attention"))
    np.testing.assert_allclose(found.scores["rollout"], expected.numpy(), rtol=1e-4, atol=1e-7)
    assert found.scores["rollout"].sum() == pytest.approx(1.0, abs=1e-5)


def test_gradient_rollout_with_ones_is_plain_rollout(ex, monkeypatch):
    weighted = attribution.explain(ex, ("gradient_rollout", "rollout"))
    monkeypatch.setattr(relevance, "gradient_fusion",
                        lambda attention, gradient: attention.float().mean(-3))
    ones = attribution.explain(ex, ("gradient_rollout", "rollout"))
    np.testing.assert_allclose(ones.scores["gradient_rollout"] / 2 ** len(ex.layout.tokens),
                               ones.scores["rollout"], rtol=1e-5, atol=1e-8)
    assert not np.allclose(weighted.scores["gradient_rollout"], ones.scores["gradient_rollout"])  # the gradient acts


def test_grad_cam_on_the_last_stage_equals_the_hand_computation(tiny, ex):
    model = tiny.model
    kept = {}
    handle = model.layers[-1].blocks[-1].register_forward_hook(lambda m, i, o: kept.update(out=o))
    try:
        logits = swin_explain.logits_from_embeddings(model, ex.embeddings)
    finally:
        handle.remove()
    features = kept["out"][0]  # (4, 4, C)
    grad, = torch.autograd.grad(logits[0, ex.target], kept["out"])
    weights = grad[0].mean(dim=(0, 1))  # one weight per channel
    cam = torch.relu((features * weights).sum(-1)).detach().numpy()  # (4, 4)
    expected = np.kron(cam, np.ones((2, 2))) / 4  # each last-stage token spread over the 2 × 2 it merged
    found = attribution.explain(ex, ("grad_cam",)).scores["grad_cam"]
    np.testing.assert_allclose(found, expected.ravel(), rtol=1e-4, atol=1e-6)
    assert found.max() > 0


def test_raw_attention_reads_the_chosen_layer_and_head(tiny, ex):
    layers = recorded(ex)
    blocks = swin_explain.blocks(tiny.model)
    dense = by_hand_dense(layers[1].attention[:ex.layout.windows(1)][:, 1], blocks[1])  # layer 1, head 1
    readout = torch.full((16,), 1 / 16) @ ex.layout.merges[2]  # the mean readout carried to the first grid
    expected = readout @ dense
    found = attribution.explain(ex, ("raw_attention",), layer=1, head=1)
    np.testing.assert_allclose(found.scores["raw_attention"], expected.numpy(), rtol=1e-4, atol=1e-7)
    assert found.raw_attention == attribution.RawAttentionSource(1, 1)
    with pytest.raises(ValueError, match="head 2 does not exist"):
        attribution.explain(ex, ("raw_attention",), layer=0, head=2)  # stage 1 has 2 heads
    with pytest.raises(ValueError, match="layer 4 does not exist"):
        attribution.explain(ex, ("raw_attention",), layer=4)


def test_integrated_gradients_completeness_and_the_curves_endpoints(ex):
    from models.analysis import faithfulness

    found = faithfulness.faithfulness(ex, "tiny", "crop", steps=4, seeds=2, ig_steps=128)
    assert found.explanations.ig_delta <= 0.01 * abs(found.explanations.ig_difference)
    with torch.no_grad():
        full = float(ex.logits(ex.embeddings)[0].softmax(-1)[ex.target])
        empty = float(ex.logits(ex.baseline)[0].softmax(-1)[ex.target])
    for curves in [*found.curves.values(), *found.random]:
        assert curves.deletion[0] == pytest.approx(full, abs=1e-5)
        assert curves.deletion[-1] == pytest.approx(empty, abs=1e-5)
        assert curves.insertion[-1] == pytest.approx(full, abs=1e-5)


def test_bad_input_gets_a_message(tiny, crop):
    names = [f"c{i}" for i in range(5)]
    with pytest.raises(ValueError, match="class 5 does not exist"):
        swin_explain.explainable(tiny, crop, names, target=5)
    with pytest.raises(ValueError, match="blank"):
        swin_explain.explainable(tiny, np.full_like(crop, 128), names, target=0)
    with pytest.raises(ValueError, match="class index"):
        swin_explain.explainable(tiny, crop, names, target=" cat")
    with pytest.raises(ValueError, match="unknown replacement"):
        swin_explain.explainable(tiny, crop, names, target=0, replacement="noise")


def test_cli_writes_the_json_contract_with_progress_on_stderr(tmp_path, capsys):
    from app import cli

    assert cli.main(["--page", "swin", "--view", "faithfulness", "--format", "json", "--out", str(tmp_path),
                     "--steps", "5", "--seeds", "2", "--ig_steps", "8", "--layer", "2", "--head", "1"]) == 0
    captured = capsys.readouterr()
    written = [line for line in captured.out.splitlines() if line]
    assert len(written) == 1 and written[0].endswith(".json")  # stdout holds only the path
    assert "[100%]" in captured.err and "perturbed inputs" in captured.err
    found = json.loads((tmp_path / written[0].split("/")[-1]).read_text())
    methods = found["methods"]
    assert len(methods) - 1 >= 5 and "random" in methods
    assert all(0 <= m["deletion_auc"] <= 1 and 0 <= m["insertion_auc"] <= 1 for m in methods.values())
    assert found["raw_attention"] == {"layer": 2, "head": 1}
    assert cli.main(["--page", "swin", "--view", "attribution", "--method", "alti", "--format", "npz,json",
                     "--out", str(tmp_path)]) == 0
    payload = json.loads(next(tmp_path.glob("*alti*.json")).read_text())
    assert np.asarray(payload["values"]).shape == (16, 16)
    # the pixel methods read any timm model's patch grid: the Swin's 4 px patches too (one registry)
    assert cli.main(["--page", "swin", "--view", "attribution", "--method", "occlusion", "--format",
                     "json", "--out", str(tmp_path)]) == 0
    payload = json.loads(next(tmp_path.glob("*occlusion*.json")).read_text())
    assert np.asarray(payload["values"]).shape == (16, 16)
    assert cli.main(["--page", "swin", "--view", "attribution", "--method", "attention_flow",
                     "--out", str(tmp_path)]) == 2
    assert "unknown method" in capsys.readouterr().err


def test_cli_progress_lines():
    import io

    from app.cli import StderrProgress

    stream = io.StringIO()
    progress = StderrProgress(stream, every=0.5)
    for step, fraction in [("forward", 0.0), ("perturbed inputs 1/10", 0.1), ("perturbed inputs 2/10", 0.2),
                           ("perturbed inputs 6/10", 0.6), ("perturbed inputs 10/10", 1.0)]:
        progress(step, fraction)
    assert stream.getvalue().splitlines() == ["[  0%] forward", "[ 10%] perturbed inputs 1/10",
                                              "[ 60%] perturbed inputs 6/10", "[100%] perturbed inputs 10/10"]


def test_swin_page_faithfulness_tab():
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app" / "views" / "swin.py"), default_timeout=180)
    at.query_params.update({"swin_view": "Faithfulness", "swin_faith_steps": "5", "swin_faith_ig_steps": "8",
                            "swin_faith_raw_layer": "1", "swin_faith_raw_head": "1"})
    at.run()
    assert not at.exception, at.exception
    table = next(f.value for f in at.dataframe if "deletion AUC (lower better)" in f.value.columns)
    assert list(table["method"]) == [*(METHODS[m].label for m in SHARED), "Random order"]
    assert "raw attention (layer 1, head 1)" in list(table["what"])
    assert any("A removed patch becomes" in m.value for m in at.markdown)


def test_vit_raw_attention_reads_the_chosen_layer_and_head():
    """The flat path too: the mini ViT's raw attention at layer 0, head 1 is the run's captured [CLS] row."""
    from PIL import Image

    from models import families
    from models.core.inputs import ImageInput
    from models.families.vit import explain as vit_explain
    from models.minis.vit_shapes import data

    loaded = families.load(next(s for s in families.specs("vit") if s.source == "mini" and s.id == "vit_shapes"))
    sample = data.make_sample(np.random.default_rng(5))
    result = families.run(loaded, ImageInput(Image.fromarray(sample.image), "shape"))
    ex = vit_explain.from_result(loaded, result, sample.label)
    found = attribution.explain(ex, ("raw_attention",), layer=0, head=1)
    captured = result.attention["self"].layer(0)[1, 0, list(ex.units)]
    np.testing.assert_allclose(found.scores["raw_attention"], captured, atol=1e-5)
    mean = attribution.explain(ex, ("raw_attention",), layer=0).scores["raw_attention"]
    np.testing.assert_allclose(mean, result.attention["self"].layer(0)[:, 0, list(ex.units)].mean(0), atol=1e-5)
