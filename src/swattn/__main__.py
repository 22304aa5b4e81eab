"""``python -m swattn`` is the ``swattn`` command."""

from swattn.cli import main

raise SystemExit(main())
