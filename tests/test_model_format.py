"""model.json's format version: a model directory of an older format is refused in one line that says what to do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.modeldir import MODEL_FORMAT, MODEL_FORMAT_VERSION, load_model_dir


def write_meta(directory, **fields):
    directory.mkdir()
    meta = {"format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION, "model_hash": "0x01FE152C", **fields}
    (directory / "model.json").write_text(json.dumps(meta))
    return directory


def test_format_1_is_refused_with_what_to_do(tmp_path):
    """Format 1 hashed the model under the runtime's former C names: its hash cannot be checked, so it is refused
    (never loaded as if it were unchanged), and the message says to compile again."""
    old = write_meta(tmp_path / "old", format_version=1)
    with pytest.raises(TinyprotoError, match=r"format version 1, written by an older tinyproto .* compile` again"):
        load_model_dir(old)
    result = subprocess.run([sys.executable, "-m", "tinyproto", "build", str(old)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "compile` again" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("version", [True, 0, MODEL_FORMAT_VERSION + 1, "1"])
def test_other_versions_are_refused_as_unknown(tmp_path, version):
    with pytest.raises(TinyprotoError, match=f"not a tinyproto model of format version {MODEL_FORMAT_VERSION}"):
        load_model_dir(write_meta(tmp_path / "m", format_version=version))
