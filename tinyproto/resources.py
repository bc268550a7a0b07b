"""Where the non-Python parts live: templates/, firmware/, boards/, tools/ at the repository root."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def resource_dir(name: str) -> Path:
    """Path of one of the data folders (`templates`, `firmware`, `boards`, `tools`)."""
    path = REPO_ROOT / name
    if not path.is_dir():
        raise FileNotFoundError(f"tinyproto installation is incomplete: {path} is missing")
    return path
