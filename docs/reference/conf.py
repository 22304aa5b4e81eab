"""Sphinx configuration of swattn's API reference, built from the docstrings:

    .venv/bin/python -m sphinx -W --keep-going -q -b html docs/reference build/docs

(``pip install -e ".[docs]"`` first). The prose pages (docs/*.md) stay plain Markdown."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "src"))

project = "swattn"
author = "the swattn developers"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
