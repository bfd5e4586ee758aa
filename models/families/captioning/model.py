"""Image captioning with attention (Xu et al. 2015, "Show, Attend and Tell"), and its modern form, a vision–language
model whose generated words attend to image tokens: write a caption (greedy or beam search), and keep for every
generated word its attention over the image, each image token mapped back to the pixels it came from.

Three architectures, one result:

- ``show-attend-tell`` (the project's mini, ``models/minis/captioning/show_attend_tell.py``): an LSTM with additive
  attention over a CNN's 8 × 8 grid; a word's map is the α_t the model itself computed (one layer, one head), under
  the ``cross`` kind.
- ``encoder-decoder`` (transformers ``VisionEncoderDecoderModel``: the mini, or a hub ViT + GPT-2 captioner): after
  decoding, one teacher-forced forward over the caption through the capture attention function records the encoder,
  decoder and cross-attention of every layer and head; a word's map is its cross-attention row over the patch tokens
  ([CLS] and other prefix tokens left out).
- ``decoder-only`` (LLaVA, SmolVLM/Idefics3, Qwen2-VL, PaliGemma, and the mini VLM, a LLaVA): the generated tokens'
  rows of the language model's self-attention over the image tokens (``vlm.RowRecorder``), kept while generating.

Row t of a word map is the attention of the step that *produced* word t (its input is word t − 1), as in the paper's
figure. Every map is over ``regions`` (``geometry.TokenRegions``): image token i came from ``regions.boxes[i]`` of the
user's picture, whatever the processor did. The result's ``image.image`` is that picture (downscaled to at most
``DISPLAY_SIDE`` px for drawing).
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.core import capture, decoding, limits, loading, selection, text
from models.core.inputs import ImageInput
from models.core.loading import SAMPLE_DATA, LoadedModel, Progress
from models.core.results import GenerationStep, ImageInfo, ImageResult, StoredAttention
from models.core.specs import ModelSpec
from models.families.captioning import geometry, vlm

ARCHITECTURES = ("show-attend-tell", "encoder-decoder", "decoder-only")
STRATEGIES = ("greedy", "beam search")
DISPLAY_SIDE = 448  # pixels: the longest side of the picture maps are drawn on
MINI_FOLDER = "captioning"
SAT_CAPTURE = "the model's own additive-attention weights α_t (returned by its forward pass)"
ROWS_CAPTURE = ("AttentionInterface 'capture' while generating: each generated token's query and every key kept, "
                "the rows recomputed from them")


@dataclass(frozen=True)
class CaptionSettings:
    strategy: str = "greedy"
    num_beams: int = 3  # beam search only
    max_new_tokens: int = 0  # 0: the model's own (40 words for the minis, 30 tokens for a hub model); at most the
    # server's generation limit (models.core.limits.MAX_NEW_TOKENS)
    candidates: int = 5  # next-token candidates kept per step (the step-through)
    instruction: str = ""  # a hub VLM's request ("": describe the image in one sentence); the minis have none
    tiles: bool = True  # SmolVLM/Idefics3: cut the image into tiles plus a thumbnail (False: the thumbnail only)

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown decoding {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.strategy == "beam search" and not 2 <= self.num_beams <= 8:
            raise ValueError("Beam width must be between 2 and 8.")
        if not 0 <= self.max_new_tokens <= limits.MAX_NEW_TOKENS:
            raise ValueError(f"Max caption tokens must be between 0 (the model's own) and {limits.MAX_NEW_TOKENS} "
                             "(ATTN_EXPLORER_MAX_NEW_TOKENS).")
        if not 1 <= self.candidates <= 20:
            raise ValueError("Candidates per step must be between 1 and 20.")
        if len(self.instruction) > 500:
            raise ValueError("The instruction is limited to 500 characters.")

    @property
    def beams(self) -> int:
        return self.num_beams if self.strategy == "beam search" else 1


@dataclass(eq=False)
class LoadedCaptioner(LoadedModel):
    """A captioner with what prepares its input: the image processor (and, for a VLM, the processor that builds the
    prompt with its image tokens)."""

    processor: Any = None
    architecture: str = ""


@dataclass(frozen=True, kw_only=True)
class CaptionResult(ImageResult):
    """A caption and every word's attention over the image (see the module docstring)."""

    caption: str
    words: tuple[str, ...]  # the produced tokens as labels: the rows of the word maps (ending with the end token)
    word_ids: tuple[int, ...]  # their ids
    architecture: str  # one of ARCHITECTURES
    generation: tuple[GenerationStep, ...]  # one per word, with the candidates it was chosen from
    image_kind: str  # the attention kind that holds the word → image maps ("cross" or "self")
    image_columns: tuple[int, ...]  # key positions of the image tokens in those maps, in region order
    regions: geometry.TokenRegions
    strategy: str
    num_beams: int
    prompt: str = ""  # a VLM's prompt as text (image tokens folded to one mark)
    settings: CaptionSettings = CaptionSettings()  # what the caption was asked with (the instruction, the tiles)
    sink_scores: np.ndarray | None = None  # (image tokens,) a VLM's massive-activation ratios; None: not measured
    model_picture: np.ndarray | None = None  # uint8 (h, w, 3): the one frame a single-frame model saw (its crop)
    seconds: float = 0.0  # decoding with capture

    def __post_init__(self):
        for array in (self.sink_scores, self.model_picture):
            if array is not None:
                array.setflags(write=False)

    @property
    def sinks(self) -> np.ndarray:
        """Indices of the image tokens that are visual attention sinks (``vlm.SINK_RATIO``)."""
        if self.sink_scores is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.sink_scores >= vlm.SINK_RATIO)


# --- loading -------------------------------------------------------------------------------------------------------

def _with(loaded: LoadedModel, **extra) -> LoadedCaptioner:
    values = {f.name: getattr(loaded, f.name) for f in dataclasses.fields(LoadedModel)}
    return LoadedCaptioner(**{**values, **extra})


def load_show_attend_tell(spec: ModelSpec, device: str, dtype: str, progress: Progress) -> LoadedCaptioner:
    from safetensors.torch import load_file
    from transformers import AutoImageProcessor, PreTrainedTokenizerFast

    from models.minis.captioning.show_attend_tell import (
        ShowAttendTell,
        ShowAttendTellConfig,
    )

    folder = SAMPLE_DATA / spec.id
    if not (folder / "model.safetensors").is_file():
        raise ValueError(f"The weights of {spec.key} are missing ({folder}/model.safetensors). Train them with "
                         "`python -m models.minis.captioning.train`.")
    progress("Reading the configuration", 0.2)
    model = ShowAttendTell(ShowAttendTellConfig.from_dict(json.loads((folder / "config.json").read_text())))
    progress("Loading weights", 0.5)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    model = loading.finish(model, device, dtype, progress)
    progress("Ready", 1.0)
    return LoadedCaptioner(spec, model, tokenizer, device, dtype, None, capture=SAT_CAPTURE, processor=processor,
                           architecture="show-attend-tell")


def _architecture_of(config) -> str:
    if getattr(config, "model_type", "") == "vision-encoder-decoder":
        return "encoder-decoder"
    vlm.geometry_kind(config)  # refuses what it cannot map back, with the models it can
    return "decoder-only"


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = lambda step, fraction: None) -> LoadedCaptioner:
    """A captioner: the project's Show, Attend and Tell, or a transformers encoder–decoder or VLM (hub id, local
    folder or mini) loaded with the capture attention function, with its processor."""
    import transformers

    if spec.family != "captioning":
        raise ValueError(f"{spec.key} is a {spec.family} model, not a captioning model")
    if spec.library == "project":
        return load_show_attend_tell(spec, device, dtype, progress)
    found: dict[str, str] = {}

    def captioner_only(config) -> None:
        found["architecture"] = _architecture_of(config)

    def model_class(config):
        if _architecture_of(config) == "encoder-decoder":
            return transformers.VisionEncoderDecoderModel
        return transformers.AutoModelForImageTextToText

    loaded = loading.load_transformers(spec, model_class, device, dtype, progress, check_config=captioner_only)
    source = str(loading.spec_folder(spec) or spec.id)
    with loading.library_errors(spec):
        if found["architecture"] == "encoder-decoder":
            processor = transformers.AutoImageProcessor.from_pretrained(source, local_files_only=spec.source != "hub")
        else:
            processor = transformers.AutoProcessor.from_pretrained(source, local_files_only=spec.source != "hub")
    capture_text = ROWS_CAPTURE if found["architecture"] == "decoder-only" else capture.CAPTURE_DESCRIPTION
    return _with(loaded, capture=capture_text, processor=processor, architecture=found["architecture"])


# --- shared pieces of a run ----------------------------------------------------------------------------------------

def display_picture(picture) -> np.ndarray:
    """The user's picture as uint8 RGB, its longest side at most ``DISPLAY_SIDE`` (small pictures are kept)."""
    from PIL import Image

    scale = DISPLAY_SIDE / max(picture.size)
    if scale < 1:
        picture = picture.resize((max(1, round(picture.width * scale)), max(1, round(picture.height * scale))),
                                 Image.Resampling.LANCZOS)
    return np.asarray(picture.convert("RGB"), dtype=np.uint8).copy()


def _image_info(picture: np.ndarray, regions: geometry.TokenRegions, prefix: tuple[str, ...] = ()) -> ImageInfo:
    first = regions.frames[0]
    scale = picture.shape[1] / regions.image_size[0]
    cell = ((first.box[3] - first.box[1]) * scale / first.grid[0],
            (first.box[2] - first.box[0]) * scale / first.grid[1])
    return ImageInfo(picture, first.grid, (max(1, round(cell[0])), max(1, round(cell[1]))), len(prefix), prefix)


def display_boxes(result: CaptionResult) -> np.ndarray:
    """Each image token's box in pixels of the picture the maps are drawn on."""
    picture = result.image.image
    return result.regions.scaled(picture.shape[1], picture.shape[0])


def _steps(logits: torch.Tensor, produced: list[int], labels: list[str], tokenizer, k: int) -> tuple:
    """One ``GenerationStep`` per produced token from the logits (steps, vocab) that produced them. Every
    architecture's query rows are the caption's words, row t the one that chose word t (STEP_CONVENTION): query t."""
    probabilities = torch.softmax(logits.float(), dim=-1).cpu()
    return tuple(GenerationStep(t, labels[t], float(probabilities[t, token]),
                                text.top_tokens(probabilities[t], tokenizer, k), query=t)
                 for t, token in enumerate(produced))


def _pixel_values(loaded: LoadedCaptioner, picture) -> torch.Tensor:
    found = loaded.processor(images=picture, return_tensors="pt")["pixel_values"]
    return found.to(loaded.device, loading.torch_dtype(loaded.dtype))


def frame_picture(image_processor, picture) -> np.ndarray | None:
    """The uint8 frame a single-frame image processor makes of ``picture`` (resized, cropped, not normalised), or
    None when it makes several frames or a padded one."""
    settings = image_processor.to_dict()
    if settings.get("do_pad") or "max_image_size" in settings or "merge_size" in settings:
        return None
    found = image_processor(images=picture, do_rescale=False, do_normalize=False, return_tensors="pt")["pixel_values"]
    return found[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy().copy()


def _caption(tokenizer, produced: list[int]) -> str:
    return tokenizer.decode(produced, skip_special_tokens=True).strip()


def _max_new(settings: CaptionSettings, default: int) -> int:
    return settings.max_new_tokens or min(default, limits.MAX_NEW_TOKENS)


# --- Show, Attend and Tell ------------------------------------------------------------------------------------------

@torch.no_grad()
def beam_search(model, pixels: torch.Tensor, beams: int, max_new: int) -> list[int]:
    """Beam search over Show, Attend and Tell (``decoding.beam_search``, transformers' rule;
    beams = 1 is greedy): the produced ids, the end token included when reached."""
    annotations, projected, hidden, cell = model.start(model.encode(pixels))

    def step(previous: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        n = len(previous)
        logits, after, _, _ = model.step(previous, state, annotations.expand(n, -1, -1),
                                         projected.expand(n, -1, -1))
        return torch.log_softmax(logits.float(), -1), after

    config = model.config
    return decoding.beam_search(step, (hidden, cell), start=config.bos_token_id,
                                end=config.eos_token_id, beams=beams, max_new=max_new,
                                device=pixels.device)


def _run_show_attend_tell(loaded: LoadedCaptioner, inputs: ImageInput, settings: CaptionSettings) -> CaptionResult:
    model, tokenizer = loaded.model, loaded.tokenizer
    picture = inputs.pil
    started = time.perf_counter()
    with torch.inference_mode():
        pixels = _pixel_values(loaded, picture)
        produced = beam_search(model, pixels, settings.beams, _max_new(settings, 40))
        decoder_input = torch.tensor([[model.config.bos_token_id, *produced[:-1]]], device=pixels.device)
        logits, alphas, _ = model(pixels, decoder_input)
    seconds = time.perf_counter() - started
    regions = geometry.single_frame(picture.size, loaded.processor.to_dict(), model.config.image_size //
                                    model.config.grid)
    words = text.display_ids(tokenizer, produced)
    cells = [f"cell ({r}, {c})" for r in range(regions.frames[0].grid[0]) for c in range(regions.frames[0].grid[1])]
    attention = {"cross": StoredAttention("cross", words, cells, [alphas[0].float().cpu().numpy()[None]])}
    return CaptionResult(
        model=loaded.info(), tokens=cells, attention=attention, input_name=inputs.name, notices=inputs.notes,
        image=_image_info(display_picture(picture), regions), caption=_caption(tokenizer, produced),
        words=tuple(words), word_ids=tuple(produced), architecture="show-attend-tell",
        generation=_steps(logits[0], produced, words, tokenizer, settings.candidates), image_kind="cross",
        image_columns=tuple(range(len(cells))), regions=regions, strategy=settings.strategy,
        num_beams=settings.beams, seconds=seconds, model_picture=frame_picture(loaded.processor, picture),
        settings=settings)


# --- encoder–decoder -------------------------------------------------------------------------------------------------

def _run_encoder_decoder(loaded: LoadedCaptioner, inputs: ImageInput, settings: CaptionSettings) -> CaptionResult:
    model, tokenizer = loaded.model, loaded.tokenizer
    picture = inputs.pil
    start = model.config.decoder_start_token_id
    started = time.perf_counter()
    with loading.friendly_out_of_memory(loaded.device, f"running {loaded.spec.key}"), torch.inference_mode():
        pixels = _pixel_values(loaded, picture)
        output = model.generate(pixel_values=pixels, max_new_tokens=_max_new(settings, 40), num_beams=settings.beams,
                                do_sample=False, early_stopping=settings.beams > 1)[0].tolist()
        produced = output[1:] if output and output[0] == start else output
        pad = model.config.pad_token_id
        while len(produced) > 1 and produced[-1] == pad and pad != model.config.eos_token_id:
            produced.pop()
        decoder_input = torch.tensor([[start, *produced[:-1]]], device=pixels.device)
        with capture.recording(model) as recorder:
            logits = model(pixel_values=pixels, decoder_input_ids=decoder_input, use_cache=False).logits[0]
    seconds = time.perf_counter() - started
    patch = int(model.config.encoder.patch_size)
    regions = geometry.single_frame(picture.size, loaded.processor.to_dict(), patch)
    encoder_tokens = recorder.records["encoder"][0].key.shape[2]
    prefix = encoder_tokens - regions.count
    if prefix < 0:
        raise ValueError(f"the encoder made {encoder_tokens} tokens, fewer than its {regions.count} patches")
    rows, cols = regions.frames[0].grid
    prefix_names = ("[CLS]",) + tuple(f"[prefix {i}]" for i in range(1, prefix)) if prefix else ()
    image_tokens = [*prefix_names, *(f"patch ({r}, {c})" for r in range(rows) for c in range(cols))]
    words = text.display_ids(tokenizer, produced)
    decoder_tokens = ["⟨start⟩", *words[:-1]]
    attention = {"encoder": recorder.attention_maps("encoder", query_tokens=image_tokens, key_tokens=image_tokens),
                 "decoder": recorder.attention_maps("decoder", query_tokens=decoder_tokens,
                                                    key_tokens=decoder_tokens),
                 "cross": recorder.attention_maps("cross", query_tokens=words, key_tokens=image_tokens)}
    return CaptionResult(
        model=loaded.info(), tokens=image_tokens, attention=attention, input_name=inputs.name, notices=inputs.notes,
        image=_image_info(display_picture(picture), regions, prefix_names), caption=_caption(tokenizer, produced),
        words=tuple(words), word_ids=tuple(produced), architecture="encoder-decoder",
        generation=_steps(logits, produced, words, tokenizer, settings.candidates), image_kind="cross",
        image_columns=tuple(range(prefix, encoder_tokens)), regions=regions, strategy=settings.strategy,
        num_beams=settings.beams, seconds=seconds, model_picture=frame_picture(loaded.processor, picture),
        settings=settings)


# --- decoder-only (LLaVA-style) -------------------------------------------------------------------------------------

def _extended(inputs: dict, produced: list[int], model_type: str) -> dict:
    """The prompt's tensors with the produced tokens (but the last) appended: the teacher-forced re-run of a beam
    search's caption (PaliGemma's suffix tokens are causal: token type 1)."""
    if len(produced) <= 1:
        return dict(inputs)
    extra = torch.tensor([produced[:-1]], device=inputs["input_ids"].device)
    grown = dict(inputs)
    grown["input_ids"] = torch.cat([inputs["input_ids"], extra], 1)
    grown["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(extra)], 1)
    for name in ("token_type_ids", "mm_token_type_ids"):
        if name in inputs:
            value = 1 if (model_type == "paligemma" and name == "token_type_ids") else 0
            grown[name] = torch.cat([inputs[name], torch.full_like(extra, value)], 1)
    return grown


def _run_decoder_only(loaded: LoadedCaptioner, inputs: ImageInput, settings: CaptionSettings) -> CaptionResult:
    model, processor = loaded.model, loaded.processor
    tokenizer = getattr(processor, "tokenizer", loaded.tokenizer)
    picture = inputs.pil
    model_type = model.config.model_type
    mini = loaded.spec.source == "mini"
    prepared = vlm.processor_inputs(loaded, picture, settings.instruction, settings.tiles)
    regions = vlm.regions_of(loaded, picture.size, prepared, settings.tiles)
    prompt_ids = prepared["input_ids"][0].tolist()
    prompt_length = len(prompt_ids)
    max_new = _max_new(settings, 40 if mini else 30)
    eos = model.generation_config.eos_token_id
    started = time.perf_counter()
    with loading.friendly_out_of_memory(loaded.device, f"running {loaded.spec.key}"), torch.inference_mode():
        common = {"max_new_tokens": max_new, "do_sample": False, "num_beams": settings.beams,
                  "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos}
        if settings.beams == 1:  # the rows are kept while generating
            with vlm.recording_rows(model, prompt_length - 1) as recorder, \
                    vlm.first_output(vlm.middle_layer(model)) as hidden:
                output = model.generate(**prepared, **common, output_logits=True, return_dict_in_generate=True)
            produced = output.sequences[0, prompt_length:].tolist()
            logits = torch.cat([step[:1] for step in output.logits])[:len(produced)]
        else:  # generate, then run the chosen caption once, teacher-forced, keeping the same rows
            sequences = model.generate(**prepared, **common, early_stopping=True)
            produced = sequences[0, prompt_length:].tolist()
            pad = common["pad_token_id"]
            while len(produced) > 1 and produced[-1] == pad and pad not in _ids(eos):
                produced.pop()
            with vlm.recording_rows(model, prompt_length - 1) as recorder, \
                    vlm.first_output(vlm.middle_layer(model)) as hidden:
                logits = model(**_extended(prepared, produced, model_type), use_cache=False).logits[
                    0, prompt_length - 1:]
    seconds = time.perf_counter() - started
    if not produced:
        raise ValueError("the model produced no token at all; try another image or instruction")
    image_id = model.config.image_token_id
    image_positions = np.flatnonzero(np.array(prompt_ids) == image_id)
    words = text.display_ids(tokenizer, produced)
    labels = text.display_ids(tokenizer, prompt_ids)
    for index, position in enumerate(image_positions):
        labels[position] = f"⟨image {index}⟩"
    key_tokens = labels + words[:-1]
    attention = {"self": recorder.maps(words, key_tokens)}
    notices = list(inputs.notes) + sorted(recorder.notes)
    if produced[-1] not in _ids(eos):
        notices.append(f"The caption stopped at {max_new} tokens before the model ended it.")
    scores = vlm.sink_scores(hidden[0], image_positions) if hidden else None
    return CaptionResult(
        model=loaded.info(), tokens=key_tokens, attention=attention, input_name=inputs.name, notices=tuple(notices),
        image=_image_info(display_picture(picture), regions), caption=_caption(tokenizer, produced),
        words=tuple(words), word_ids=tuple(produced), architecture="decoder-only",
        generation=_steps(logits, produced, words, tokenizer, settings.candidates), image_kind="self",
        image_columns=tuple(int(p) for p in image_positions), regions=regions, strategy=settings.strategy,
        num_beams=settings.beams, prompt=_folded_prompt(labels), sink_scores=scores, seconds=seconds,
        model_picture=frame_picture(processor.image_processor, picture) if mini else None, settings=settings)


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _folded_prompt(labels: list[str]) -> str:
    """The prompt as text with each run of image tokens folded to one mark: ``⟨64 image tokens⟩``."""
    out, run = [], 0
    for label in labels:
        if label.startswith("⟨image "):
            run += 1
            continue
        if run:
            out.append(f"⟨{run} image tokens⟩")
            run = 0
        out.append(label)
    if run:
        out.append(f"⟨{run} image tokens⟩")
    return " ".join(out)


# --- the run --------------------------------------------------------------------------------------------------------

def run(loaded: LoadedCaptioner, inputs: ImageInput, options: CaptionSettings | None = None) -> CaptionResult:
    """Caption ``inputs`` with ``options`` and keep every word's attention over the image (the module docstring)."""
    settings = options or CaptionSettings()
    settings.validate()
    if loaded.architecture == "show-attend-tell":
        return _run_show_attend_tell(loaded, inputs, settings)
    if loaded.architecture == "encoder-decoder":
        return _run_encoder_decoder(loaded, inputs, settings)
    return _run_decoder_only(loaded, inputs, settings)


# --- word → image maps -----------------------------------------------------------------------------------------------

def image_layers(result: CaptionResult) -> int:
    return result.maps(result.image_kind).num_layers


def image_heads(result: CaptionResult, layer: int | None) -> int:
    maps = result.maps(result.image_kind)
    return maps.heads_in(0 if layer is None else layer)


def chosen(result: CaptionResult, layer, head=selection.MEAN) -> tuple[int | None, int | None]:
    """(layer index, or None for every layer averaged; head index, or None for the mean) that a layer and head
    choice (``models/core/selection.py``) name in this result, checked against the model."""
    index = selection.layer_index(layer, image_layers(result), averages=True)
    return index, selection.head_index(head, image_heads(result, index))


def word_attention(result: CaptionResult, layer: int | None = None, head: int | None = None) -> np.ndarray:
    """Each word's attention on each image token, float32 ``(words, image tokens)``: a layer's head (``head`` None:
    the heads' mean), or the mean over layers (``layer`` None). Not renormalised: a row sums to the share of the
    word's attention that went to the image (the rest went to text or prefix tokens)."""
    maps = result.maps(result.image_kind)
    layers = range(maps.num_layers) if layer is None else [layer]
    for index in layers:
        if not 0 <= index < maps.num_layers:
            raise ValueError(f"layer {index} does not exist: this model has layers 0..{maps.num_layers - 1}")
    columns = np.asarray(result.image_columns)
    total = np.zeros((len(result.words), len(columns)), dtype=np.float32)
    for index in layers:
        total += np.asarray(maps.head(index, head), dtype=np.float32)[:len(result.words)][:, columns]
    return total / np.float32(len(layers))


def describe_layer(result: CaptionResult, layer: int | None, head: int | None) -> str:
    """Which map, in words: "additive attention α_t", "layer 2, head 1", "all layers, heads averaged"."""
    maps = result.maps(result.image_kind)
    if maps.num_layers == 1 and maps.num_heads == 1:
        return "additive attention α_t"
    where = "all layers" if layer is None else f"layer {layer}"
    return f"{where}, {'heads averaged' if head is None else f'head {head}'}"


# --- the minis' measurements ------------------------------------------------------------------------------------------

def mini_metrics() -> dict[str, dict]:
    """Each trained mini's ``metrics.json`` by architecture (what the page compares); empty before training."""
    found = {}
    for name in ARCHITECTURES:
        path = SAMPLE_DATA / MINI_FOLDER / name / "metrics.json"
        if path.is_file():
            found[name] = json.loads(path.read_text())
    return found


def closest_to_truth(metrics: dict) -> tuple[str, str]:
    """(architecture, sentence): whose noun maps point at the named object most often, measured, with the margin."""
    ranked = sorted(metrics, key=lambda name: -metrics[name]["pointing"]["nouns"]["default"])
    best = ranked[0]
    nouns = metrics[best]["pointing"]["nouns"]
    rest = "; ".join(f"{short_title(n)} {metrics[n]['pointing']['nouns']['default']:.0%}" for n in ranked[1:])
    close = False
    if len(ranked) > 1:  # the difference of two independent rates: its standard error from both
        second = metrics[ranked[1]]["pointing"]["nouns"]
        close = nouns["default"] - second["default"] < 2 * (nouns["default_se"] ** 2 + second["default_se"] ** 2) ** 0.5
    return best, (f"Closest to the truth, measured: **{short_title(best)}** — its noun maps point at the "
                  f"named object {nouns['default']:.0%} of the time (random cell: {nouns['random']:.0%}); " + rest +
                  (". The margin is within two standard errors: call it a tie." if close else "."))


def short_title(name: str) -> str:
    """An architecture's name as the page writes it."""
    from models.minis.captioning import card

    return card.SHORT_TITLES.get(name, name)
