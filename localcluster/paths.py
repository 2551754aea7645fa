"""Where the repository is, and the one cache the expensive builds share.

The shell scripts under hack/ spell the same default as
``CACHE="${GPUSHARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare}"`` and the Makefile exports it,
so every tool finds the same builds.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    """``$GPUSHARE_CACHE``, else ``${XDG_CACHE_HOME:-$HOME/.cache}/gpushare``."""
    explicit = os.environ.get("GPUSHARE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpushare"
