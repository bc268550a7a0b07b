"""The command line (top layer): one module per verb group; `main` is the click group. Layer: cli."""

from tinyproto.cli.main import main

__all__ = ["main"]
