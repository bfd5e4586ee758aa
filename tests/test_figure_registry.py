"""Every figure a page shows comes from the one registry of views (viz.figures.VIEWS), so the page, the CLI and the
downloads draw the same thing: a page asks for figures by view name only, each name it asks for is a view the CLI
offers for that page (``python -m app.cli --page P --view V``), and no page imports a builder to call it directly.

Read from the pages' source (every ``figure_or_none("name", …)``/``resources.figure("name", …)``/``figures.build(
"name", …)`` in a page file and the app modules it imports): running every page and tab to find out would take
minutes, and a name computed at run time would escape either way, so names are string literals by rule.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app import catalog, cli

APP = Path(__file__).resolve().parent.parent / "app"
REQUESTS = {"figure_or_none", "figure", "build", "figure_png"}  # the calls that name a view first
SHARED = {"app.widgets", "app.resources", "app.display", "app.url_state", "app.presentation", "app.sidebar",
          "app.catalog", "app.run_log", "app.warmup", "app.server_cpu", "app.http_guard", "app.image_input"}


def _module_file(name: str) -> Path | None:
    path = APP.parent / Path(*name.split("."))
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _app_imports(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("app"):
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}" if _module_file(f"{node.module}.{alias.name}") else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("app.")}
    return found - SHARED


def _closure(page: catalog.Page) -> dict[str, ast.AST]:
    """The page's file and every app module it imports (sections, shared view code), parsed."""
    todo, seen = [f"app.views.{page.name}"], {}
    while todo:
        name = todo.pop()
        if name in seen or (path := _module_file(name)) is None:
            continue
        seen[name] = ast.parse(path.read_text())
        todo += sorted(_app_imports(seen[name]))
    return seen


def _requested(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if function in REQUESTS:
                names.add(node.args[0].value)
    return names


# a page that shows another family's model beside its own draws that family's views, which the CLI offers under that
# family's page: the MLP-Mixer page compares with a ViT on the same input
BESIDE = {"mixer": ("vit",), "corpus": ("gpt",)}  # corpus: a document through the model, as the GPT page draws it


def _importers() -> dict[str, set[str]]:
    """Module -> the pages whose closure holds it."""
    found: dict[str, set[str]] = {}
    for page in catalog.PAGES:
        for name in _closure(page):
            found.setdefault(name, set()).add(page.name)
    return found


# the corpus page still draws five figures by calling builders (issue 29): strict, so the fix must remove this
PAGES = [pytest.param(page, id=page.name) for page in catalog.PAGES]


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_a_page_asks_for_is_a_view_the_cli_offers_for_that_page(page):
    offered = {view.name for view in catalog.views(page)}
    for other in BESIDE.get(page.name, ()):
        offered |= {view.name for view in catalog.views(catalog.get(other))}
    closure = _closure(page)
    assert set().union(*(_requested(tree) for tree in closure.values())), f"{page.name} asks for no figure"
    importers = _importers()
    # view code shared by several pages (app/attention_view.py, the faithfulness section) asks for what each family
    # offers (a name a family lacks is refused by the registry with a message): there, each name must be offered by
    # one of the pages that import it; a module only this page imports must ask for this page's views only
    own = set().union(*(_requested(tree) for name, tree in closure.items() if importers[name] == {page.name}))
    missing = own - offered
    assert not missing, f"the {page.name} page draws {sorted(missing)}, which `python -m app.cli --page " \
                        f"{page.name} --list` does not offer"


def test_view_code_shared_by_pages_asks_for_views_one_of_them_offers():
    importers = _importers()
    trees = {name: tree for page in catalog.PAGES for name, tree in _closure(page).items()}
    for name, pages in importers.items():
        if len(pages) < 2:
            continue
        offered = set().union(*({view.name for view in catalog.views(catalog.get(p))} for p in pages))
        missing = _requested(trees[name]) - offered
        assert not missing, f"{name} (shared by {sorted(pages)}) asks for {sorted(missing)}, which none offers"


@pytest.mark.parametrize("page", PAGES)
def test_no_page_calls_a_figure_builder_directly(page):
    """A page imports only option classes and constants from viz.figures, never a builder to call: a figure drawn by
    a direct call is one the CLI and the downloads do not know."""
    import importlib
    import inspect

    for name, tree in _closure(page).items():
        builders, modules = set(), {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("viz.figures"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    value = getattr(module, alias.name, None)
                    if inspect.ismodule(value):  # from viz.figures import corpus as figures
                        modules[alias.asname or alias.name] = value
                    elif callable(value) and not isinstance(value, type):
                        builders.add(alias.name)
        for node in ast.walk(tree):  # figures.some_builder(...) on a module of builders
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in modules:
                value = getattr(modules[node.func.value.id], node.func.attr, None)
                if inspect.isfunction(value):
                    builders.add(f"{node.func.value.id}.{node.func.attr}")
        assert not builders, f"{name} calls figure builders {sorted(builders)} directly"


def test_the_cli_lists_every_view_of_every_page():
    listing = cli.listing()
    for page in catalog.PAGES:
        assert f"--page {page.name}" in listing
        section = listing.split(f"--page {page.name}", 1)[1].split("\n--page ", 1)[0]
        for view in catalog.views(page):
            assert f"--view {view.name}:" in section, (page.name, view.name)


def test_every_page_is_in_one_section_of_the_navigation():
    """The sidebar groups pages (app/catalog.SECTIONS) and lists all of them expanded: none folds behind Streamlit's
    "View more"; every catalog page is in exactly one section, and no section is empty."""
    from app import catalog

    grouped = [page for pages in catalog.sections().values() for page in pages]
    assert sorted(page.name for page in grouped) == sorted(page.name for page in catalog.PAGES)
    assert all(catalog.sections().values())
    main = (catalog.VIEWS_DIR.parent / "main.py").read_text()
    assert "catalog.sections()" in main and "expanded=True" in main
