"""Headless export of any page's views, for papers and batch figures, through the same figure builders as the pages.

    python -m app.cli --page gpt --text "The animal didn't cross the street" --view head --layer 3 --head 5 \
        --format png,svg,json,csv,npz --out figures/
    python -m app.cli --page gpt --text-file book.txt --device cuda --dtype bfloat16 --view query_row --query 5000
    python -m app.cli --page vit --image cat --view rollout --fusion max --format png,npz
    python -m app.cli --page positional --view sinusoidal --d 256
    python -m app.cli --page speech --audio clip.wav --task translate --view cross --format json,npz
    python -m app.cli --list                       # every page, its views and their options

Every page is covered: ``--page`` is one of the app's pages (app/catalog.py) and ``--view`` one of its views (the
first by default). A view's options are flags named after its fields (``--layer 3 --head mean``; ``mean`` or
``none`` stand for an average or "not set" where the option allows it); a family's run options too (``--strategy
"beam search" --num_beams 4``). ``--model`` takes a registry key (default: the page's offline model), a hub id or a
folder; ``--text`` or ``--image`` (a sample name or a file; ``shapes:SEED`` for the DETR page's generated scene,
``scene:SEED`` for the captioning page's) the input (default: the page's sample). Nothing here
imports Streamlit: models run through ``models.families`` and figures come from ``viz.figures``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from app import catalog
from viz import export

NONE_WORDS = ("mean", "none", "all")


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict[str, str]]:
    """The fixed flags, and every other ``--name value`` pair (view and run options) by name."""
    parser = argparse.ArgumentParser(prog="python -m app.cli", description=__doc__.split("\n\n")[0],
                                     epilog="Run with --list to see every page, view and option.",
                                     allow_abbrev=False)  # a view's --d is its own option, not --device/--dtype
    parser.add_argument("--page", default=catalog.PAGES[0].name, help=", ".join(p.name for p in catalog.PAGES))
    parser.add_argument("--view", help="one of the page's views (default: the first); see --list")
    parser.add_argument("--model", help="registry key, hub id or local folder (default: the page's offline model)")
    parser.add_argument("--text", help="the input text (text pages; default: the page's sample)")
    parser.add_argument("--text-file", type=Path, help="a UTF-8 .txt file as the input text (a long prompt: its "
                                                       "token limit defaults to the device's highest)")
    parser.add_argument("--image", help="a sample photo's name, an image file, shapes:SEED (DETR's generated scene) or "
                                        "scene:SEED (captioning's); image pages; default: cat")
    parser.add_argument("--audio", help="a sample clip's name or an audio file (speech page; default: its sample)")
    parser.add_argument("--max-tokens", type=int, help="token limit of the input (default: the family's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--format", default="png,json", help=f"comma-separated: {', '.join(export.FORMATS)}")
    parser.add_argument("--out", type=Path, default=Path("."), help="output folder")
    parser.add_argument("--list", action="store_true", help="list every page, its views and their options")
    args, rest = parser.parse_known_args(argv)
    args.formats = [f.strip() for f in args.format.split(",") if f.strip()]
    unknown = set(args.formats) - set(export.FORMATS)
    if unknown:
        parser.error(f"unknown format(s) {', '.join(sorted(unknown))}; choose from {', '.join(export.FORMATS)}")
    options: dict[str, str] = {}
    while rest:
        flag = rest.pop(0)
        if not flag.startswith("--") or "=" not in flag and not rest:
            parser.error(f"unexpected argument {flag!r}: options are given as --name value")
        name, _, value = flag[2:].partition("=")
        options[name.replace("-", "_")] = value if "=" in flag else rest.pop(0)
    return args, options


def convert(text: str, annotation: str, name: str) -> Any:
    """A flag's text as the option's type (``int``, ``float``, ``bool``, ``str``, ``tuple[int, int]``, ``X | None``)."""
    if str(annotation) in ("Layer", "Head"):  # one parser for every view's layer and head (models/core/selection)
        from models.core import selection

        return selection.parse(text, str(annotation).lower())
    kinds = {part.strip() for part in str(annotation).split("|")}
    if "None" in kinds and text.strip().lower() in NONE_WORDS:
        return None
    try:
        if "bool" in kinds:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        if "int" in kinds:
            return int(text)
        if "float" in kinds:
            return float(text)
        if any(kind.startswith("tuple") for kind in kinds):
            return tuple(int(part) for part in text.replace("-", ",").split(",") if part.strip())
    except ValueError:
        allowed = " or 'mean'" if "None" in kinds else ""
        raise ValueError(f"--{name} must be {' or '.join(sorted(kinds - {'None'}))}{allowed}, not {text!r}") from None
    return text


def build_options(cls: type | None, given: dict[str, str], used: set[str], only_if_given: bool = False):
    """An instance of the dataclass ``cls`` with the given fields converted, the rest at their defaults; None when
    ``only_if_given`` and no field of it was given (a family's run options: none given = a plain run)."""
    if cls is None:
        return None
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in given:
            values[field.name] = convert(given[field.name], field.type, field.name)
            used.add(field.name)
    return None if only_if_given and not values else cls(**values)


def resolve_spec(family: str, model: str | None):
    from models import families

    if not model:
        return families.default_spec(family)
    known = {spec.key: spec for spec in families.specs(family)}
    return known.get(model) or families.custom(family, model)


def make_inputs(family, page: catalog.Page, args: argparse.Namespace):
    from models.core import images, limits
    from models.core.inputs import AudioInput, ImageInput, TextInput

    if family.input is AudioInput:
        from models.families.speech import model as speech
        return speech.cli_input(args.audio or page.sample)
    if family.input is ImageInput:
        name = args.image or page.sample
        if name in images.SAMPLES:
            return ImageInput(images.load_sample(name), f"sample {name}")
        if name.startswith("shapes:") and name[7:].isdigit():  # the DETR page's generated scene of that seed
            from PIL import Image

            from models.minis.detr_shapes import data
            return ImageInput(Image.fromarray(data.page_scene(int(name[7:])).image), f"shapes {int(name[7:])}")
        if name.startswith("scene:") and name[6:].isdigit():  # the captioning page's generated scene of that seed
            from PIL import Image

            from models.minis.captioning import scenes
            return ImageInput(Image.fromarray(scenes.page_scene(int(name[6:])).image), f"scene {int(name[6:])}")
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"--image {name!r} is neither a sample ({', '.join(images.sample_names())}) nor a file")
        return ImageInput(images.decode_image(path.read_bytes(), f"the file {path.name!r}"), path.stem)
    text = args.text if args.text is not None else page.sample
    default_tokens = 128 if family.name == "translation" else limits.DEFAULT_TOKENS
    if args.text_file is not None:
        from models.core import text as text_utils

        if args.text is not None:
            raise ValueError("give --text or --text-file, not both")
        if not args.text_file.is_file():
            raise ValueError(f"--text-file {str(args.text_file)!r} is not a file")
        text = text_utils.decode_upload(args.text_file.read_bytes())
        default_tokens = limits.max_tokens(args.device)
    return TextInput(text, args.max_tokens or default_tokens)


def figure_for(args: argparse.Namespace, given: dict[str, str]):
    """Load, run, analyse and draw what the flags ask for: the figure of one view."""
    from models import families

    page = catalog.get(args.page)
    views = catalog.views(page)
    names = [v.name for v in views]
    name = args.view or names[0]
    if name == "attribution" and name not in names and "token_attribution" in names:  # the text pages' attribution
        name = "token_attribution"
    if name not in names:
        raise ValueError(f"the {page.name} page has no view {name!r}; choose from {', '.join(names)}")
    view = views[names.index(name)]
    used: set[str] = set()
    options = build_options(view.options, given, used)
    family_name = page.family or view.family
    loaded = result = None
    if family_name is not None and (page.family is not None or view.data == "analysis"):
        family = families.get(family_name)
        model = args.model or (family.default_model(given) if family.default_model else None)
        loaded = families.load(resolve_spec(family_name, model), args.device, args.dtype)
        if page.family is not None:
            run_options = build_options(family.options, given, used, only_if_given=True)
            if run_options is None and family.options is not None and view.run_options:
                run_options = family.options()
            result = families.run(loaded, make_inputs(family, page, args), run_options)
    unused = sorted(set(given) - used)
    if unused:
        fields = [f.name for f in view.option_fields()]
        raise ValueError(f"the {name} view has no option {', '.join('--' + u for u in unused)}; it has: "
                         f"{', '.join('--' + f for f in fields) or 'none'}")
    data = view.analysis(loaded, result, options) if view.data == "analysis" else result
    return view.build(data, options)


def listing() -> str:
    """Every page, its views, and each view's options with their defaults; then the explanation
    methods a ``--method`` names (models/analysis/methods.py)."""
    from models.analysis.methods import METHODS

    lines = []
    for page in catalog.PAGES:
        lines.append(f"--page {page.name}" + (f"  (model family {page.family})" if page.family else ""))
        for view in catalog.views(page):
            defaults = ", ".join(f"--{f.name} {getattr(view.options(), f.name)!r}" for f in view.option_fields())
            lines.append(f"    --view {view.name}: {view.title}" + (f"  [{defaults}]" if defaults else ""))
    lines.append("--method (the explanation views; each family's adapter offers some of them):")
    lines += [f"    {name}: {method.what}" for name, method in METHODS.items()]
    return "\n".join(lines)


def render(args: argparse.Namespace, given: dict[str, str]) -> list[Path]:
    """Run the model and write the requested files; returns their paths."""
    return export.write(figure_for(args, given), args.formats, args.out)


def main(argv: list[str] | None = None) -> int:
    from models.core import memory

    args, given = parse(argv)
    if args.list:
        print(listing())
        return 0
    memory.use_fixed_mmap_threshold()  # as the app does: long inputs do not pin freed activations
    try:
        with progress_to_stderr(args.page):
            return _write(args, given)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        for word, options in (getattr(error, "suggestions", None) or {}).items():  # translation's unknown words
            print(f"  {word}: did you mean {', '.join(options) or '(no close word)'}?", file=sys.stderr)
        return 2


class StderrProgress:
    """What a long analysis reports (``models.analysis.explanations.reporting``: faithfulness curves, explanations, the
    pointing game), as lines on stderr so the files and paths on stdout stay clean: one line when the step's kind
    changes or the fraction moves by ``every``, and a last line at 100 %."""

    def __init__(self, stream=None, every: float = 0.1):
        self.stream, self.every = stream or sys.stderr, every
        self.last_fraction, self.last_kind = -1.0, None

    def __call__(self, step: str, fraction: float) -> None:
        kind = step.rstrip("0123456789/ ")  # "perturbed inputs 64/480" -> "perturbed inputs"
        if kind == self.last_kind and fraction - self.last_fraction < self.every and fraction < 1.0:
            return
        if kind == self.last_kind and fraction == self.last_fraction:
            return
        self.last_fraction, self.last_kind = fraction, kind
        print(f"[{fraction:4.0%}] {step}", file=self.stream, flush=True)


def progress_to_stderr(page: str):
    """Progress on stderr for a page with a model (its analyses report); a formula page loads no torch for it."""
    import contextlib

    if page not in {p.name for p in catalog.PAGES} or catalog.get(page).family is None:
        return contextlib.nullcontext()
    from models.analysis import explanations as explainable

    return explainable.reporting(StderrProgress())


def _write(args: argparse.Namespace, given: dict[str, str]) -> int:
    if args.page == "corpus":  # a corpus run, or a results folder, drawn as a corpus view (app/corpus_cli.py)
        from app import corpus_cli

        paths = corpus_cli.render(args, given, build_options)
    else:
        paths = render(args, given)
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
