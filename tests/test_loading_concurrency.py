"""Two sessions loading models at the same moment (two pages opened at once, or a page opened while the server's
warm-up loads the default model) both get a working model, and the process stays healthy for the loads after.

PyTorch's default device (``with torch.device("meta")``, which transformers' ``from_pretrained`` enters, and so do
our size estimates in models/core/memory_fit.py) is process-global state: two threads entering and leaving it at
once left it on "meta", after which every load failed with "Cannot copy out of meta tensor" until the server was
restarted. Building a model now holds one lock (models/core/loading.py, ``constructing``).
"""
from __future__ import annotations

import threading

import pytest
import torch

from tests import tiny_text_models

ROUNDS = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("concurrent_loads")
    return root, {"causal_lm": tiny_text_models.save_tiny_causal_lm(root / "lm"),
                  "encoder": tiny_text_models.save_tiny_encoder(root / "bert")}


def test_models_loaded_in_two_threads_at_once_all_work_and_the_default_device_stays(folders, monkeypatch):
    root, saved = folders
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(root))
    start, failures = threading.Barrier(len(saved)), []

    def load_repeatedly(family: str) -> None:
        for _ in range(ROUNDS):
            start.wait()
            try:
                loaded = tiny_text_models.load_local(family, saved[family])
                assert all(p.device.type == "cpu" for p in loaded.model.parameters()), "a parameter is not on cpu"
            except Exception as error:  # noqa: BLE001 - every failure is reported
                failures.append(f"{family}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=load_repeatedly, args=(family,)) for family in saved]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not failures, f"{len(failures)} of {ROUNDS * len(saved)} loads failed; first: {failures[0]}"
    assert torch.get_default_device() == torch.device("cpu")
    assert tiny_text_models.load_local("encoder", saved["encoder"]) is not None  # and later loads still work
