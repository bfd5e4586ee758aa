"""Whether a model fits before it is loaded: its size from the checkpoint's headers or its config, against the memory
free on the device it is going to.

Loading a model that does not fit takes the whole server down (the kernel's OOM killer ends the process every
browser session runs in) or, on a GPU, fails half-way after minutes of download. The size is known before a single
weight is read: a local folder's safetensors headers give every tensor's shape (exact, milliseconds); otherwise the
config is built on PyTorch's ``meta`` device, which allocates nothing (0.3 s for a 70 B Llama).
"""
from __future__ import annotations

import logging

import json
import struct
from pathlib import Path

import torch

from models.core import construction

FIT_MARGIN = 1.1  # the forward's activations and the allocator's slack on top of the weights
# Shares of the memory free at that moment that one run (its kept q/k and activations) and one view (a reduction's
# chunk, or a whole map) may take: other sessions run beside it on the same server and device.
RUN_SHARE = 0.8
VIEW_SHARE = 0.5
CHECK_FROM_BYTES = 256 * 2**20  # work below this is not checked (reading the free memory costs milliseconds)

logger = logging.getLogger(__name__)


def _safetensors_parameters(folder: Path) -> int | None:
    """Elements of every tensor in ``folder``'s safetensors files, from their headers only; None without any."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        for key, entry in header.items():
            if key != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total


def _meta_parameters(model_class, config) -> int:
    """Parameters of ``model_class`` built from ``config`` on the meta device (no memory, no weights)."""
    build = getattr(model_class, "from_config", None) or model_class._from_config  # Auto* class, or a model class
    with construction.LOCK, torch.device("meta"):  # the default device is process-global (construction.py)
        model = build(config)
        if hasattr(model, "tie_weights"):
            model.tie_weights()  # tied embeddings are one tensor once loaded
    return sum(parameter.numel() for parameter in model.parameters())


def parameter_count(model_class, config, source: str | Path) -> tuple[int | None, str]:
    """(how many parameters the model at ``source`` has, "") or (None, why that cannot be told before loading):
    the load then goes on without the check, and says so (``loading.load_transformers``)."""
    folder = Path(source)
    try:
        if folder.is_dir() and (count := _safetensors_parameters(folder)) is not None:
            return count, ""
        return _meta_parameters(model_class, config), ""
    except Exception as error:  # a config only its own class understands: the load itself will say what is wrong
        logger.warning("memory check: could not count the parameters of %s: %s", source, error, exc_info=True)
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"


def timm_parameter_count(name: str, **kwargs) -> int | None:
    """How many parameters ``timm.create_model(name, **kwargs)`` would have, before any weight is read: a
    ``local-dir:`` folder's safetensors headers, else the architecture built on the meta device (a hub id reads only
    its small config); None when it cannot be told (the load itself then says what is wrong)."""
    if name.startswith("local-dir:") and (count := _safetensors_parameters(Path(name[len("local-dir:"):]))):
        return count
    try:
        import timm

        with construction.LOCK, torch.device("meta"):
            model = timm.create_model(name, pretrained=False, **kwargs)
        return sum(parameter.numel() for parameter in model.parameters())
    except Exception as error:  # an unknown name: timm's own error says so when the load runs
        logger.warning("memory check: could not count the parameters of %s: %s", name, error)
        return None


def _cgroup_free() -> int | None:
    """Bytes this process's cgroup may still use (containers), None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            if limit == "max" or int(limit) >= 2**60:
                return None
            return int(limit) - int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def free_bytes(device: str) -> int | None:
    """Memory free for a new model on ``device`` (all GPUs together when the model spreads over them); None where
    it cannot be told."""
    if device.startswith("cuda"):
        spread = torch.cuda.device_count() > 1  # loading.spans_gpus: device_map="auto" over every GPU
        indices = range(torch.cuda.device_count()) if spread else [torch.device(device).index or 0]
        return sum(torch.cuda.mem_get_info(index)[0] for index in indices)
    if device == "mps":
        recommended = getattr(torch.mps, "recommended_max_memory", None)
        return None if recommended is None else recommended() - torch.mps.current_allocated_memory()
    try:
        import psutil

        free = psutil.virtual_memory().available
    except ImportError:
        free = None
    cgroup = _cgroup_free()
    return cgroup if free is None else free if cgroup is None else min(free, cgroup)


def free_for_tensors(device: str) -> int | None:
    """Bytes a new tensor can take on ``device`` now: on a GPU the driver's free memory plus what PyTorch's caching
    allocator holds unused (freed tensors it keeps for reuse), on that one device; elsewhere ``free_bytes``."""
    if device.startswith("cuda"):
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        free = torch.cuda.mem_get_info(index)[0]
        return free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    return free_bytes(device)


def check(model_id: str, parameters: int | None, device: str, dtype: torch.dtype) -> None:
    """Refuse, with its size and the memory free, a model of ``parameters`` that cannot fit on ``device``."""
    free = free_bytes(device)
    if parameters is None or free is None:
        return
    itemsize = torch.empty((), dtype=dtype).element_size()
    needed = parameters * itemsize
    if needed * FIT_MARGIN > free:
        dtype_name = str(dtype).removeprefix("torch.")
        raise ValueError(f"'{model_id}' does not fit in memory: its {parameters / 1e9:,.2f} billion parameters need "
                         f"about {needed / 2**30:,.1f} GB in {dtype_name}, and {device} has "
                         f"{max(free, 0) / 2**30:,.1f} GB free. It was not loaded; everything else keeps working. "
                         "Pick a smaller model, or half precision on a GPU.")
