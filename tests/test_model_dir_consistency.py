"""Every field of a model directory is checked against the model it holds (families.model_dir_disagreement):
model.json's family and budget, report.json's family, sizes, hash, bytes, budget and board, the test vectors'
shapes. An inconsistent directory is refused in one line by every verb that reads it, never validated or
reported under the wrong name. The verbs run in-process (click's runner): the refusal is the CLI's own code, and an
interpreter start per verb (numpy, scikit-learn) would cost more than the check."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from tinyproto import families
from tinyproto.cli import main
from tinyproto.core.modeldir import load_model_dir


@pytest.fixture(scope="module")
def flynn_iris(compiled):
    """iris / FlyNN / 1 kB, compiled once per run (conftest's `compiled`); this module's copy."""
    return compiled("iris", "1kB", "flynn")


def _other_family(name: str) -> str:
    return next(n for n in families.names() if n != name)


def _edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


EDITS = {
    "model.json family": ("model.json", lambda d: d.update(family=_other_family(d["family"]))),
    "report.json model": ("report.json", lambda d: d.update(model=_other_family(d["model"]))),
    "report.json n_features": ("report.json", lambda d: d.update(n_features=d["n_features"] + 1)),
    "report.json n_classes": ("report.json", lambda d: d.update(n_classes=d["n_classes"] + 1)),
    "report.json model_hash": ("report.json", lambda d: d.update(model_hash="0x00000001")),
    "report.json model_bytes": ("report.json", lambda d: d.update(model_bytes=d["model_bytes"] - 1)),
    "report.json budget_bytes": ("report.json", lambda d: d.update(budget_bytes=d["budget_bytes"] * 2)),
    "report.json board": ("report.json", lambda d: d.update(board="nano")),
    "budget below the model": ("both", None),
    "vectors of another width": ("npz", None),
}


def test_a_consistent_directory_passes(flynn_iris):
    model_dir = load_model_dir(flynn_iris)
    assert families.model_dir_disagreement(model_dir, families.load_int_model(model_dir)) is None


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_every_disagreement_is_refused(flynn_iris, tmp_path, edit):
    m = tmp_path / "m"
    shutil.copytree(flynn_iris, m)
    where, change = EDITS[edit]
    if where == "both":
        nbytes = json.loads((m / "report.json").read_text())["model_bytes"]
        _edit_json(m / "model.json", lambda d: d.update(budget_bytes=nbytes - 1))
        _edit_json(m / "report.json", lambda d: d.update(budget_bytes=nbytes - 1))
    elif where == "npz":
        with np.load(m / "test_vectors.npz") as z:
            arrays = {k: z[k] for k in z.files}
        arrays["X_raw"] = np.hstack([arrays["X_raw"], arrays["X_raw"][:, :1]])
        arrays["xq"] = np.hstack([arrays["xq"], arrays["xq"][:, :1]])
        np.savez(m / "test_vectors.npz", **arrays)
    else:
        _edit_json(m / where, change)
    for verb in (["export", m, "--arduino", "--out", tmp_path / "lib"], ["report", m], ["build", m]):
        result = CliRunner().invoke(main, [str(word) for word in verb])
        # a refusal ends in sys.exit(1); an exception escaping the verb would show here as another exception
        assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (verb, result.output,
                                                                                   result.exception)
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "inconsistent" in result.stderr or "damaged" in result.stderr, result.stderr


@pytest.mark.parametrize("change", ["wider", "another class count", "fewer labels"])
def test_vectors_that_do_not_fit_the_model_are_refused_under_their_own_name(flynn_iris, tmp_path, change):
    """test_vectors.npz recorded in model.json (its sha256 updated too) yet shaped for another model: the file that
    is wrong is named, not model.json (which the hashes vouch for)."""
    import hashlib

    m = tmp_path / "m"
    shutil.copytree(flynn_iris, m)
    with np.load(m / "test_vectors.npz") as z:
        arrays = {k: z[k] for k in z.files}
    if change == "wider":
        arrays["X_raw"] = np.hstack([arrays["X_raw"], arrays["X_raw"][:, :1]])
        arrays["xq"] = np.hstack([arrays["xq"], arrays["xq"][:, :1]])
    elif change == "another class count":
        arrays["scores"] = np.hstack([arrays["scores"], arrays["scores"][:, :1]])
    else:
        arrays["labels"] = arrays["labels"][:-1]
    np.savez(m / "test_vectors.npz", **arrays)
    digest = hashlib.sha256((m / "test_vectors.npz").read_bytes()).hexdigest()
    _edit_json(m / "model.json", lambda d: d.update(vectors_sha256=digest))
    for verb in (["validate", m, "--sim"], ["report", m], ["build", m]):
        result = CliRunner().invoke(main, [str(word) for word in verb])
        assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (verb, result.output)
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1 and "test_vectors.npz is damaged" in line, line
        assert "model.json" in line.split("test_vectors.npz is damaged", 1)[1]  # what it does not fit
        assert "model.json is damaged" not in line, line


def test_a_directory_without_its_report_is_refused_by_the_verbs_that_record_its_figures(built_models, tmp_path):
    """report.json missing was read as empty: build wrote model_bytes null into build.json, and validate then
    blamed build.json ("model_bytes is 330, not report.json's None; run tinyproto build again", which cannot help)."""
    from helpers import refused

    m = tmp_path / "m"
    shutil.copytree(built_models("iris", "1kB"), m)
    (m / "report.json").unlink()
    for verb in (["build", str(m)], ["validate", str(m), "--sim"], ["flash", str(m), "--sim"]):
        line = refused(verb, "has no report.json", tmp_path, own_files_at_root=True)
        assert "run `tinyproto compile` again" in line, line
