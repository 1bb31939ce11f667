"""``python -m computehal``: the same as the ``computehal`` command."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
