"""The app's pages: one file each in app/views/, routed by app/main.py and drawn headless by ``python -m app.cli``.

A page with a family shows that family's results and offers its views (``Family.views``); a page without one
(positional encodings, the mechanics of attention) owns its views (``View.page``). No Streamlit here: the CLI reads
this too.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VIEWS_DIR = Path(__file__).resolve().parent / "views"


@dataclass(frozen=True)
class Page:
    name: str  # the file app/views/<name>.py, its URL path and the CLI's --page
    title: str
    icon: str  # a Material icon (emoji need a font projector PCs and headless Chromium often lack)
    family: str | None = None  # the model family whose results it shows
    sample: str = ""  # the input the page opens with (the CLI's default input)
    section: str = "Language"  # the group the navigation lists it under (SECTIONS)

    @property
    def file(self) -> Path:
        return VIEWS_DIR / f"{self.name}.py"


# the navigation's groups, in order: every page one click away (a flat list of 13 folded three behind "View more")
SECTIONS = ("Language", "Vision", "Speech", "How attention works", "Across a corpus")

# the first page is the default and lives at the root URL
PAGES = (
    Page("gpt", "Language model (GPT)", ":material/chat:", "causal_lm",
         "The animal didn't cross the street because it was too tired."),
    Page("encoder", "Encoder (BERT)", ":material/swap_horiz:", "encoder",
         "The trophy didn't fit in the suitcase because it was too big."),
    Page("translation", "Translation", ":material/translate:", "translation",
         "The agreement on the European Economic Area was signed in August 1992."),
    Page("moe", "Mixture of experts", ":material/call_split:", "moe",
         "Anna found the old map in the kitchen. Later, she counted 12 boats by the river.\n\n"
         "def count_prices(prices, total):\n    for item in prices:\n        total = total + item\n"
         "    return total\n\n2024-03-15 17.25 381\n12 + 30 = 42"),
    Page("vit", "Vision Transformer", ":material/image:", "vit", "cat", "Vision"),
    Page("swin", "Swin Transformer", ":material/grid_view:", "swin", "cat", "Vision"),
    Page("mixer", "MLP-Mixer", ":material/blender:", "mixer", "cat", "Vision"),
    Page("detr", "Object detection (DETR)", ":material/center_focus_strong:", "detr", "cat", "Vision"),
    Page("captioning", "Image captioning", ":material/subtitles:", "captioning", "cat", "Vision"),
    Page("speech", "Speech (Whisper)", ":material/mic:", "speech", "en quick_brown_fox", "Speech"),
    Page("mechanics", "How attention works", ":material/calculate:", section="How attention works"),
    Page("positional", "Positional encodings", ":material/straighten:", section="How attention works"),
    Page("corpus", "Corpus statistics", ":material/library_books:", section="Across a corpus"),
)


def sections() -> dict[str, list[Page]]:
    """The pages by section, in the navigation's order."""
    return {section: [page for page in PAGES if page.section == section] for section in SECTIONS}


def get(name: str) -> Page:
    for page in PAGES:
        if page.name == name:
            return page
    raise ValueError(f"there is no page called {name!r}; there are: {', '.join(p.name for p in PAGES)}")


def views(page: Page) -> list:
    """The ``viz.figure.View`` objects a page offers, its default first."""
    from models import families
    from viz import figures

    if page.family is not None:
        return [figures.get(name) for name in families.get(page.family).views]
    return figures.page_views(page.name)
