"""Allows ``python -m vitqs``."""

from vitqs.cli import main

raise SystemExit(main())
