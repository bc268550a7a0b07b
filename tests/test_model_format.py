"""model.json's format version: a model directory of an older format is refused in one line that says what to do."""

from __future__ import annotations

import json

import pytest
from helpers import tinyproto

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.modeldir import MODEL_FORMAT, MODEL_FORMAT_VERSION, load_model_dir


def write_meta(directory, **fields):
    directory.mkdir()
    meta = {"format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION, "model_hash": "0x01FE152C", **fields}
    (directory / "model.json").write_text(json.dumps(meta))
    return directory


@pytest.mark.parametrize("version", range(1, MODEL_FORMAT_VERSION))
def test_an_older_format_is_refused_with_what_to_do(tmp_path, version):
    """Older formats hashed the model under other generated defines (the runtime's former C names, no prefix, no
    confidence width): their hash cannot be checked, so they are refused (never loaded as if unchanged, never
    called edited), and the message says to compile again."""
    old = write_meta(tmp_path / "old", format_version=version)
    with pytest.raises(TinyprotoError,
                       match=rf"format version {version}, written by an older tinyproto .* compile` again"):
        load_model_dir(old)
    result = tinyproto("build", str(old), timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "compile` again" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("version", [True, 0, MODEL_FORMAT_VERSION + 1, "1"])
def test_other_versions_are_refused_as_unknown(tmp_path, version):
    with pytest.raises(TinyprotoError, match=f"not a tinyproto model of format version {MODEL_FORMAT_VERSION}"):
        load_model_dir(write_meta(tmp_path / "m", format_version=version))
