"""``python -m computehal.bench``: the same as ``computehal bench``."""

from __future__ import annotations

from . import main

raise SystemExit(main())
