"""docs/notebooks/quickstart.ipynb runs in a real Jupyter kernel (nbclient + ipykernel, offline): no cell raises, every
figure's output carries its Vega-Lite spec or its image, and the figure it saves holds the numbers ``python -m app.cli``
writes for the same input and view."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from tests.conftest import ROOT

NOTEBOOK = ROOT / "docs" / "notebooks" / "quickstart.ipynb"
PROMPT = "The animal didn't cross the street because it was too tired."  # the notebook's GPT cell


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    import nbclient
    import nbformat

    folder = tmp_path_factory.mktemp("quickstart")  # the kernel's working folder: the notebook saves figures there
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), path]))  # as `pip install -e .` would
    try:
        nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(folder)}}).execute()
    finally:
        os.environ["PYTHONPATH"] = path
    return notebook, folder


def figure_outputs(notebook) -> list[dict]:
    """Every output that shows one of the explorer's figures (its text form starts with "<figure")."""
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
            if output.output_type in ("execute_result", "display_data")
            and str(output.data.get("text/plain", "")).startswith("<figure")]


def test_every_cell_runs_and_every_figure_carries_its_chart_or_image(executed):
    notebook, _ = executed
    errors = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
              if output.output_type == "error"]
    assert not errors
    figures = figure_outputs(notebook)
    assert len(figures) >= 8  # head, grid, rollout, lens, focus, step, explanation, the user's model's head
    for output in figures:
        data = output.data
        spec = next((value for mime, value in data.items() if mime.startswith("application/vnd.vegalite")), None)
        if spec is not None:
            spec = spec if isinstance(spec, dict) else json.loads(spec)
            assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/")
            assert "vegaEmbed" in data["text/html"]
        else:
            assert data.get("image/png"), f"a figure without its chart or image: {data.get('text/plain')}"
    first_cells = [cell for cell in notebook.cells if cell.cell_type == "code"][1:5]
    assert [len(cell.source.strip().splitlines()) for cell in first_cells] == [1, 1, 1, 1]  # one line each
    assert any("image/png" in output.data for output in figures)  # the grid and the rollout are images


def test_the_saved_figure_holds_what_the_cli_writes(executed, tmp_path):
    """The notebook's saved GPT head (``gpt.head(13, 8).save("figures")``) against ``python -m app.cli`` for the
    same text and view."""
    from app import cli

    _, folder = executed
    assert cli.main(["--page", "gpt", "--text", PROMPT, "--view", "head", "--layer", "13", "--head", "8",
                     "--format", "csv,json,npz", "--out", str(tmp_path)]) == 0
    written = sorted(tmp_path.iterdir())
    assert len(written) == 3
    for path in written:
        ours = folder / "figures" / path.name  # the same stem: model, input, kind, layer, head
        assert ours.is_file(), sorted(p.name for p in (folder / "figures").iterdir())
        if path.suffix == ".npz":
            with np.load(path) as expected, np.load(ours) as saved:
                assert sorted(expected.files) == sorted(saved.files)
                for name in expected.files:  # weights to float32's last bits (the kernel's threads)
                    if np.issubdtype(expected[name].dtype, np.floating):
                        np.testing.assert_allclose(saved[name], expected[name], rtol=0, atol=1e-6)
                    else:
                        np.testing.assert_array_equal(saved[name], expected[name])
        elif path.suffix == ".csv":
            pd.testing.assert_frame_equal(pd.read_csv(ours, index_col=0), pd.read_csv(path, index_col=0))
        else:
            saved, expected = json.loads(ours.read_text()), json.loads(path.read_text())
            np.testing.assert_allclose(saved.pop("weights"), expected.pop("weights"),
                                       rtol=0, atol=1e-6)
            assert saved == expected
