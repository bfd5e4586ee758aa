"""DETR (Carion et al. 2020, "End-to-End Object Detection with Transformers") from transformers: each object query's
decoder cross-attention over the image, with that query's box and class.

A CNN backbone turns the image into an ``h × w`` grid of features (stride 8 in the mini DETR, 32 in DETR-R50); the
encoder's self-attention mixes those image tokens; ``num_queries`` learned object queries go through the decoder,
each attending to the others (self-attention) and to the image tokens (cross-attention, ``(queries, h·w)`` per head);
a small head turns every query into a class distribution (the last class is "no object") and a box. DETR's Fig. 6
draws, for each query that found an object, its cross-attention over the image with its box: the extremities of the
object light up. Attention is captured through the ``AttentionInterface`` (models/core/capture.py: DETR's attention
modules call it in transformers v5), so ``attention`` holds the contract's ``encoder``, ``decoder`` and ``cross``
maps.

Sources: the project's mini DETR (sample_data/detr_shapes, trained on generated shapes with boxes), a hub id
(``facebook/detr-resnet-50``) or a local folder saved with ``save_pretrained``. The image is centre-cropped to a
square of ``image_size`` pixels (the mini's 64, else ``HUB_IMAGE_SIZE``) and normalised as the checkpoint was trained.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from models.core import capture, images, loading
from models.core.inputs import ImageInput
from models.core.loading import LoadedModel, Progress
from models.core.results import ImageInfo, ImageResult
from models.core.specs import ModelSpec

HUB_IMAGE_SIZE = 512  # DETR-R50 was trained at 800 px on the short side; 512 keeps every layer's maps small
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # DETR-R50's normalisation


@dataclass(eq=False)
class LoadedDetr(LoadedModel):
    """A DETR with the capture attention function, and how to prepare an image for it."""

    data_config: dict = field(default_factory=dict)
    label_names: tuple[str, ...] = ()  # one per class, without "no object"


def _data_config(config) -> dict:
    size = int(getattr(config, "image_size", 0) or HUB_IMAGE_SIZE)
    return {"input_size": (3, size, size), "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "center",
            "mean": tuple(getattr(config, "image_mean", None) or IMAGENET_MEAN),
            "std": tuple(getattr(config, "image_std", None) or IMAGENET_STD)}


def _label_names(config) -> tuple[str, ...]:
    labels = {int(k): str(v) for k, v in (config.id2label or {}).items()}
    return tuple(labels.get(i, f"class {i}") for i in range(config.num_labels))


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = lambda step, fraction: None) -> LoadedDetr:
    """DetrForObjectDetection from the mini folder, a hub id or a local folder, with attention captured."""
    import transformers

    capture.register()
    source = str(loading.spec_folder(spec) or spec.id)
    local_only = spec.source != "hub"
    progress("Reading the configuration", 0.2)
    with loading.library_errors(spec):
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False,
                                                         local_files_only=local_only)
    if config.model_type != "detr":
        raise ValueError(f"'{spec.id}' is a {config.model_type} model, not DETR; pick a DetrForObjectDetection "
                         "checkpoint such as facebook/detr-resnet-50.")
    if getattr(config, "backbone_config", None) is not None:  # the checkpoint holds the backbone's weights too
        config.backbone_config.use_pretrained_backbone = False
    config.use_pretrained_backbone = False
    progress("Loading weights" + (" (downloading if not cached)" if spec.source == "hub" else ""), 0.45)
    with loading.library_errors(spec, device=device):
        model = transformers.DetrForObjectDetection.from_pretrained(
            source, config=config, dtype=loading.torch_dtype(dtype), attn_implementation=capture.ATTENTION_NAME,
            use_safetensors=None, local_files_only=local_only)
    model = loading.finish(model, device, dtype, progress)
    progress("Ready", 1.0)
    return LoadedDetr(spec, model, None, device, dtype, data_config=_data_config(config),
                      label_names=_label_names(config))


# --- running -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class DetrResult(ImageResult):
    """DETR on one image: ``attention`` holds ``encoder`` (image tokens), ``decoder`` (queries) and ``cross``
    (queries × image tokens) maps; ``image.patch_grid`` is the backbone's ``(h, w)`` feature grid."""

    class_probabilities: np.ndarray  # (queries, classes + 1), softmax; the last column is "no object"
    boxes: np.ndarray  # (queries, 4) x0, y0, x1, y1 in pixels of the crop
    label_names: tuple[str, ...]  # one per class (not "no object")
    forward_seconds: float

    def __post_init__(self):
        for array in (self.class_probabilities, self.boxes):
            array.setflags(write=False)

    @property
    def scores(self) -> np.ndarray:
        """Each query's best object class probability ``(queries,)``."""
        return self.class_probabilities[:, :-1].max(-1)

    @property
    def labels(self) -> np.ndarray:
        """Each query's best object class ``(queries,)``."""
        return self.class_probabilities[:, :-1].argmax(-1)

    def detected(self, threshold: float) -> list[int]:
        """Queries whose best object class has probability ≥ ``threshold``, most confident first."""
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"the score threshold is a probability: between 0 and 1, not {threshold}")
        order = np.argsort(-self.scores, kind="stable")
        return [int(q) for q in order if self.scores[q] >= threshold]


def run(loaded: LoadedDetr, inputs: ImageInput, options: None = None) -> DetrResult:
    """Crop and normalise the image, run DETR once with attention captured, keep every query's class and box."""
    model = loaded.model
    prepared = images.preprocess(inputs.pil, loaded.data_config)
    pixels = prepared.tensor.to(loaded.device, loading.torch_dtype(loaded.dtype))
    started = time.perf_counter()
    with loading.friendly_out_of_memory(loaded.device, f"running {loaded.spec.key}"), torch.inference_mode(), \
            capture.recording(model) as recorder:
        output = model(pixel_values=pixels)
    forward_seconds = time.perf_counter() - started

    height, width = prepared.crop.shape[:2]
    image_tokens = recorder.records["cross"][0].key.shape[2]
    side = math.isqrt(image_tokens)  # the crop is square, so is the feature grid
    if side * side != image_tokens:
        raise ValueError(f"{image_tokens} image tokens do not make a square grid for a square crop")
    grid = (side, side)
    stride = (height / side, width / side)
    queries = [f"query {i}" for i in range(model.config.num_queries)]
    patches = [f"token ({r}, {c})" for r in range(side) for c in range(side)]
    attention = {"encoder": recorder.attention_maps("encoder", query_tokens=patches, key_tokens=patches),
                 "decoder": recorder.attention_maps("decoder", query_tokens=queries, key_tokens=queries),
                 "cross": recorder.attention_maps("cross", query_tokens=queries, key_tokens=patches)}

    probabilities = output.logits[0].float().softmax(-1).cpu().numpy()
    cx, cy, w, h = output.pred_boxes[0].float().cpu().numpy().T
    boxes = np.stack([(cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height], 1)
    return DetrResult(model=loaded.info(), tokens=queries, attention=attention, input_name=inputs.name,
                      notices=inputs.notes,
                      image=ImageInfo(prepared.crop, grid, (round(stride[0]), round(stride[1])), 0, ()),
                      class_probabilities=probabilities.astype(np.float32), boxes=boxes.astype(np.float32),
                      label_names=loaded.label_names, forward_seconds=forward_seconds)
