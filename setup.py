"""Packaging that pyproject.toml cannot say alone: the non-Python parts stay at the repository root
(templates/, firmware/, boards/, tools/) for development and are shipped inside the wheel as
tinyproto/_data/<name>/, where tinyproto/resources.py finds them in an installed copy."""

from setuptools import find_packages, setup

DATA_DIRS = ("templates", "firmware", "boards", "tools")

setup(
    packages=find_packages(include=["tinyproto", "tinyproto.*"]) + [f"tinyproto._data.{d}" for d in DATA_DIRS],
    package_dir={f"tinyproto._data.{d}": d for d in DATA_DIRS},
    package_data={f"tinyproto._data.{d}": ["**/*"] for d in DATA_DIRS},
)
