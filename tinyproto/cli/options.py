"""Click option types shared by every command, so each is spelled and checked once."""

from __future__ import annotations

from pathlib import Path

import click

# numpy's seed range: a seed outside it is refused by click in one line, not deep inside training
SEED = click.IntRange(0, 2**32 - 1)
BUDGET_HELP = "Model size limit in flash: 2kB, 2KiB, 1.5kB, 2048B or 2048 (1 kB = 1024 bytes)."
MODEL_DIR = click.Path(path_type=Path, file_okay=False)
