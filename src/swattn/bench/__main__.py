"""``python -m swattn.bench``: the extend benchmark (see :mod:`swattn.bench.cli`)."""

from .cli import main

raise SystemExit(main())
