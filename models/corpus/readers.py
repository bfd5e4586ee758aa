"""Where a corpus comes from: bundled sets that work offline, uploaded files, or a folder (the command line).

A corpus is a list of ``Document(doc_id, text, source)`` plus the files or parts that were *not* read, each as
``Skipped(doc_id, reason)``: an empty file, a binary file, a single paragraph longer than ``MAX_DOCUMENT_CHARS``,
a zip member that would expand past ``MAX_ZIP_BYTES`` or by more than ``MAX_ZIP_RATIO`` (a zip bomb) are recorded
with a reason and the run goes on with the rest.

Bundled corpora (no download, no extra package):
- ``python-docs``: the paragraphs of Python's own documentation topics (``pydoc_data.topics``, the text behind
  ``help("if")``), shipped with every CPython; PSF License Agreement (Python Software Foundation License);
- ``translation``: English sentences of this project's translation grammar (models/minis/translation), generated;
- ``moe-mix``: the mini-MoE's generated prose, Python code and numbers (models/minis/moe/data.py), generated.
The shapes set is images only: it has no text to read.
"""
from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

MAX_DOCUMENT_CHARS = 200_000  # one document beyond this is skipped (a 10 MB single line is not a paragraph)
MAX_FILE_BYTES = 64 * 2**20  # a file beyond this is skipped without being read whole
MAX_ZIP_BYTES = 256 * 2**20  # uncompressed bytes read out of one zip, all members together
MAX_ZIP_RATIO = 200  # uncompressed / compressed of one member: above it, a zip bomb
MIN_PARAGRAPH_CHARS = 120  # bundled documentation: shorter paragraphs are headings and one-line notes
TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".zip")


@dataclass(frozen=True)
class Document:
    doc_id: str  # unique in the corpus: "<file>#<paragraph>" or "<corpus>#<index>"
    text: str
    source: str = ""  # the file or bundled set it came from


@dataclass(frozen=True)
class Skipped:
    doc_id: str
    reason: str


@dataclass(frozen=True)
class Corpus:
    name: str
    documents: list[Document]
    skipped: list[Skipped]
    licence: str = ""

    def head(self, count: int) -> "Corpus":
        """The first ``count`` documents (the skipped parts stay recorded)."""
        return Corpus(self.name, self.documents[:count], self.skipped, self.licence)


BUNDLED = {
    "python-docs": ("Python documentation topics (pydoc_data.topics, ~1,200 paragraphs)",
                    "PSF License Agreement (Python Software Foundation); shipped with CPython"),
    "translation": ("English sentences of this project's translation grammar (generated)",
                    "this project's licence (generated text)"),
    "moe-mix": ("Prose, Python code and numbers generated for the mini-MoE (generated)",
                "this project's licence (generated text)"),
}


def bundled(name: str, count: int | None = None) -> Corpus:
    """One of ``BUNDLED`` (generated sets: ``count`` documents, default 2,000), in a fixed order."""
    if name not in BUNDLED:
        raise ValueError(f"no bundled corpus {name!r}; choose one of {', '.join(BUNDLED)}")
    licence = BUNDLED[name][1]
    if name == "python-docs":
        from pydoc_data.topics import topics

        documents = []
        for topic in sorted(topics):
            paragraphs = [p.strip() for p in topics[topic].split("\n\n")]
            for index, paragraph in enumerate(p for p in paragraphs if len(p) >= MIN_PARAGRAPH_CHARS):
                documents.append(Document(f"{topic}#{index}", paragraph, "pydoc_data.topics"))
        return Corpus(name, documents[:count] if count else documents, [], licence)
    count = count or 2000
    if name == "translation":
        from models.minis.translation.grammar import Grammar

        pairs = Grammar(seed=1234).sample(count)
        return Corpus(name, [Document(f"sentence#{i}", p.english, "translation grammar") for i, p in enumerate(pairs)],
                      [], licence)
    import random

    from models.minis.moe import data

    rng = random.Random(1234)
    documents = []
    while len(documents) < count:
        text = "\n\n".join(segment.text for segment in data.document(rng))
        documents.append(Document(f"mix#{len(documents)}", text, "mini-MoE generator"))
    return Corpus(name, documents, [], licence)


def _decode(name: str, data: bytes) -> tuple[str | None, str]:
    """(text, "") or (None, why it is not text)."""
    if not data.strip():
        return None, "empty file"
    if b"\x00" in data[:8192]:
        return None, "binary file (NUL bytes), not text"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError as error:
        return None, f"not UTF-8 text (byte {error.start}); binary or another encoding"


def _paragraphs(name: str, text: str) -> tuple[list[Document], list[Skipped]]:
    documents, skipped = [], []
    for index, paragraph in enumerate(p.strip() for p in text.replace("\r\n", "\n").split("\n\n")):
        if not paragraph:
            continue
        doc_id = f"{name}#{index}"
        if len(paragraph) > MAX_DOCUMENT_CHARS:
            skipped.append(Skipped(doc_id, f"{len(paragraph):,} characters in one paragraph (over the "
                                           f"{MAX_DOCUMENT_CHARS:,}-character limit for one document)"))
        else:
            documents.append(Document(doc_id, paragraph, name))
    return documents, skipped


def _jsonl(name: str, text: str) -> tuple[list[Document], list[Skipped]]:
    documents, skipped = [], []
    for index, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        doc_id = f"{name}#{index}"
        if len(line) > MAX_DOCUMENT_CHARS:
            skipped.append(Skipped(doc_id, f"line of {len(line):,} characters (over the {MAX_DOCUMENT_CHARS:,} limit)"))
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            skipped.append(Skipped(doc_id, f"line {index + 1} is not JSON ({error.msg})"))
            continue
        value = item.get("text") if isinstance(item, dict) else item
        if not isinstance(value, str) or not value.strip():
            skipped.append(Skipped(doc_id, f"line {index + 1} has no \"text\" string"))
        else:
            documents.append(Document(doc_id, value.strip(), name))
    return documents, skipped


def read_bytes(name: str, data: bytes) -> tuple[list[Document], list[Skipped]]:
    """The documents of one uploaded file (.txt/.md: paragraphs; .jsonl: one {"text": ...} a line; .zip: its
    members), and what was skipped with the reason."""
    suffix = Path(name).suffix.lower()
    if suffix == ".zip":
        return _zip(name, data)
    if len(data) > MAX_FILE_BYTES:
        return [], [Skipped(name, f"{len(data):,} bytes (over the {MAX_FILE_BYTES:,}-byte limit for one file)")]
    text, why = _decode(name, data)
    if text is None:
        return [], [Skipped(name, why)]
    return _jsonl(name, text) if suffix == ".jsonl" else _paragraphs(name, text)


def _zip(name: str, data: bytes) -> tuple[list[Document], list[Skipped]]:
    """Members read with a cap on what they expand to: the declared sizes of a zip can lie, so each member is read
    at most to its share of ``MAX_ZIP_BYTES`` + 1 byte and refused beyond it."""
    documents, skipped = [], []
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        return [], [Skipped(name, "not a valid zip archive")]
    budget = MAX_ZIP_BYTES
    with archive:
        for info in archive.infolist():
            member = f"{name}/{info.filename}"
            if info.is_dir():
                continue
            if Path(info.filename).suffix.lower() not in (".txt", ".md", ".jsonl"):
                skipped.append(Skipped(member, "not a .txt, .md or .jsonl file"))
                continue
            ratio = info.file_size / max(info.compress_size, 1)
            if ratio > MAX_ZIP_RATIO or info.file_size > budget:
                skipped.append(Skipped(member, f"expands {info.compress_size:,} → {info.file_size:,} bytes "
                                               f"(ratio {ratio:,.0f}; a zip bomb or over the {MAX_ZIP_BYTES:,}-byte "
                                               "limit): not read"))
                continue
            try:
                with archive.open(info) as stream:
                    content = stream.read(min(budget, MAX_FILE_BYTES) + 1)
            except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError) as error:
                skipped.append(Skipped(member, f"cannot be read ({error})"))
                continue
            if len(content) > min(budget, MAX_FILE_BYTES):
                skipped.append(Skipped(member, "expands past its declared size and the limit: not read"))
                continue
            budget -= len(content)
            found, left_out = read_bytes(member, content)
            documents += found
            skipped += left_out
    return documents, skipped


def read_files(files: list[tuple[str, bytes]], name: str = "upload") -> Corpus:
    """Uploaded files ``[(name, bytes)]`` as one corpus."""
    documents, skipped = [], []
    for file_name, data in files:
        found, left_out = read_bytes(file_name, data)
        documents += found
        skipped += left_out
    return Corpus(name, documents, skipped, "as uploaded")


def read_folder(folder: str | Path) -> Corpus:
    """Every .txt, .md, .jsonl and .zip file under ``folder`` (sorted, recursively); other files are skipped."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ValueError(f"{str(folder)!r} is not a folder; give a folder of .txt, .jsonl or .zip files")
    documents, skipped = [], []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = str(path.relative_to(root))
        if path.suffix.lower() not in TEXT_SUFFIXES:
            skipped.append(Skipped(relative, f"not one of {', '.join(TEXT_SUFFIXES)}"))
            continue
        if path.stat().st_size > MAX_FILE_BYTES and path.suffix.lower() != ".zip":
            skipped.append(Skipped(relative, f"{path.stat().st_size:,} bytes (over the {MAX_FILE_BYTES:,}-byte "
                                             "limit for one file)"))
            continue
        found, left_out = read_bytes(relative, path.read_bytes())
        documents += found
        skipped += left_out
    if not documents and not skipped:
        raise ValueError(f"{str(folder)!r} holds no files")
    return Corpus(root.name, documents, skipped, "as found in the folder")
