"""Every view's figure builder, registered by name in ``viz.figure.VIEWS`` (one module per area).

Importing this package registers them all; ``build`` draws any view from its data and options. Pages, the CLI and the
download buttons all come through here, so a figure is built in exactly one place.
"""
from __future__ import annotations

from typing import Any

from viz.figure import VIEWS, Figure, View
from viz.figures import (ablation, attention, lens, mechanics, moe, patching, positional, swin,  # noqa: F401
                         translation, vit)  # (register views)
from viz.figures import mixer  # noqa: F401,E402  (register views)


def get(name: str) -> View:
    if name not in VIEWS:
        raise ValueError(f"there is no view called {name!r}; there are: {', '.join(sorted(VIEWS))}")
    return VIEWS[name]


def build(name: str, data: Any, options: Any = None) -> Figure:
    """Draw view ``name`` from ``data`` (a run result, an analysis's output, or None for formula views) with
    ``options`` (the view's defaults when None)."""
    found = get(name)
    return found.build(data, options if options is not None else found.options())


def page_views(page: str) -> list[View]:
    """The views a page without a family owns (positional, mechanics)."""
    return [v for v in VIEWS.values() if v.page == page]
