"""``attention-explorer``: the console command ``pip install -e .`` adds. It starts the app as the README's
``streamlit run app/streamlit_app.py`` does from the clone, with the project's ``.streamlit/config.toml``; any
options are Streamlit's (``attention-explorer --server.port 8502``)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    from streamlit.web import cli

    os.chdir(ROOT)  # Streamlit reads .streamlit/config.toml from the working directory
    arguments = sys.argv[1:] if argv is None else argv
    return cli.main(["run", str(ROOT / "app" / "streamlit_app.py"), *arguments], prog_name="attention-explorer")


if __name__ == "__main__":
    raise SystemExit(main())
