"""The memory-fit check (models/core/memory_fit.py) for timm models, the ViT and Swin pages' loader: a model too large for
the memory free is refused with its size and the memory free, before a weight is read or downloaded."""
from __future__ import annotations

import json
import struct

import pytest
import timm
import torch
from streamlit.testing.v1 import AppTest

from models import families
from models.core import loading, memory_fit
from models.families.swin import model as swin
from models.families.vit import model as vit
from tests.conftest import ROOT
from tests.test_app_vit import tiny_vits  # noqa: F401  (a fixture: the page's listed models load tiny ViTs)
from tests.test_vit import save_tiny_vit


@pytest.fixture
def no_weights_read(monkeypatch):
    """Fail the test if timm is asked for a large model's pretrained weights (the check must refuse before that)."""
    real = timm.create_model

    def create(name, pretrained=False, **kwargs):
        assert not (pretrained and ("giant" in name or "large" in name)), f"{name}'s weights were asked for"
        return real(name, pretrained=pretrained, **kwargs)

    monkeypatch.setattr(timm, "create_model", create)


def test_the_size_of_a_timm_model_is_its_parameter_count():
    """Built on the meta device (no memory) and counted, it matches the same model built for real."""
    for name in ("vit_tiny_patch16_224", "swin_tiny_patch4_window7_224"):
        real = sum(p.numel() for p in timm.create_model(name, pretrained=False).parameters())
        assert memory_fit.timm_parameter_count(name) == real
    assert memory_fit.timm_parameter_count("vit_tiny_patch16_224", img_size=112) == sum(
        p.numel() for p in timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=112).parameters())
    assert memory_fit.timm_parameter_count("vit_no_such_model_42") is None  # the load then says it is unknown


def test_a_local_folder_is_sized_from_its_safetensors_headers(tmp_path):
    model = save_tiny_vit(tmp_path / "tiny")
    assert memory_fit.timm_parameter_count(f"local-dir:{tmp_path / 'tiny'}") == sum(
        p.numel() for p in model.parameters())


def test_a_huge_vit_is_refused_with_its_size_and_the_memory_free(no_weights_read, monkeypatch):
    monkeypatch.setattr(memory_fit, "free_bytes", lambda device: 2**30)  # 1 GB free
    with pytest.raises(ValueError) as refused:
        vit.load(vit.custom_spec("vit_giant_patch14_224"), "cpu", "float32")
    count = sum(p.numel() for p in timm.create_model("vit_giant_patch14_224", pretrained=False,
                                                     device="meta").parameters())
    message = str(refused.value)
    assert "does not fit in memory" in message and f"{count / 1e9:,.2f} billion parameters" in message
    assert f"about {count * 4 / 2**30:,.1f} GB in float32" in message and "cpu has 1.0 GB free" in message


def test_a_huge_swin_is_refused(no_weights_read, monkeypatch):
    monkeypatch.setattr(memory_fit, "free_bytes", lambda device: 100 * 2**20)  # 100 MB free
    with pytest.raises(ValueError, match=r"'swin_large_patch4_window7_224' does not fit in memory: its 0\.20 billion "
                                         r"parameters need about 0\.7 GB in float32, and cpu has 0\.1 GB free"):
        swin.load(families.custom("swin", "swin_large_patch4_window7_224"), "cpu", "float32")


def test_a_local_folder_claiming_a_huge_tensor_is_refused_from_its_header(monkeypatch, tmp_path):
    """Only the header exists (no tensor data): reading any weight would fail differently."""
    folder = tmp_path / "huge"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_base_patch16_224", "num_classes": 10}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [200_000, 100_000], "data_offsets": [0, 8 * 10**10]}})
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    monkeypatch.setattr(memory_fit, "free_bytes", lambda device: 8 * 2**30)
    with pytest.raises(ValueError, match=r"its 20\.00 billion parameters need about 74\.5 GB in float32, and cpu has "
                                         r"8\.0 GB free"):
        loading.create_timm(vit.custom_spec(str(folder)), f"local-dir:{folder}")


def test_the_vit_page_says_so_and_keeps_working(tiny_vits, no_weights_read, monkeypatch):
    monkeypatch.setattr(memory_fit, "free_bytes", lambda device: 2**30)
    at = AppTest.from_file(str(ROOT / "app" / "views" / "vit.py"), default_timeout=120).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    box = at.sidebar.selectbox(key="model_vit")
    box.set_value(box.options[-1]).run()
    at.sidebar.text_input(key="custom_model_vit").set_value("vit_giant_patch14_224").run()
    assert not at.exception
    assert any("does not fit in memory" in e.value and "GB free" in e.value for e in at.error)
    assert torch.get_default_device().type == "cpu"  # the meta build left no default device behind
    box.set_value(box.options[0]).run()  # a listed model still works in the same session
    assert not at.exception and not at.error, [e.value for e in at.error]
