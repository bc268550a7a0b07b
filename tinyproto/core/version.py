"""tinyproto's version, which every layer may write into what it generates. Layer: core."""

__version__ = "0.1.0"  # the same as pyproject.toml's
