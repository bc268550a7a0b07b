"""Where the non-Python parts live: templates/, firmware/, boards/, tools/.

In a checkout (or an editable install) they sit at the repository root; an installed wheel carries them
inside the package as tinyproto/_data/<name>/ (see setup.py).
Layer: core.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # tinyproto/ (this file is tinyproto/core/resources.py)
# The directory that makes `import tinyproto` work (for child processes: PlatformIO's test command); in a
# checkout it is the repository root.
IMPORT_ROOT = PACKAGE_DIR.parent


def _is_checkout(root: Path) -> bool:
    pyproject = root / "pyproject.toml"
    return pyproject.is_file() and 'name = "tinyproto"' in pyproject.read_text(errors="replace", encoding="utf-8")


def resource_dir(name: str) -> Path:
    """Path of one of the data folders (`templates`, `firmware`, `boards`, `tools`)."""
    candidates = [PACKAGE_DIR / "_data" / name]
    if _is_checkout(IMPORT_ROOT):
        candidates.insert(0, IMPORT_ROOT / name)
    for path in candidates:
        if path.is_dir():
            return path
    raise FileNotFoundError(f"tinyproto installation is incomplete: {candidates[-1]} is missing; reinstall tinyproto")
