"""`tinyproto compile` for ProtoNN: budgets, ledger == rendered bytes, host C == numpy reference, determinism."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

from tinyproto.device.hostc import build_host_runner, run_int8, run_raw
from tinyproto.core.modeldir import load_model_dir
from tinyproto import families
from tinyproto.cli import main

from helpers import header_array_bytes, needs

@pytest.mark.parametrize("data", ["digits", "breast_cancer"])
@pytest.mark.parametrize("budget", ["0.5kB", "1kB", "2kB", "4kB", "16kB"])
def test_budget_is_never_exceeded_and_ledger_equals_header(compiled, data, budget):
    model_dir = load_model_dir(compiled(data, budget))
    report = model_dir.report
    header = (model_dir.path / "include" / "tinyproto_model.h").read_text()
    rendered = header_array_bytes(header)
    ledger = {name: entry["bytes"] for name, entry in report["ledger"]["arrays"].items()}
    assert rendered == ledger
    assert report["model_bytes"] == sum(rendered.values()) <= report["budget_bytes"]
    assert report["budget_bytes"] == int(float(budget[:-2]) * 1024)


@needs("gcc")
@pytest.mark.parametrize("data,budget", [("digits", "2kB"), ("breast_cancer", "1kB"), ("digits", "0.5kB")])
def test_host_c_equals_numpy_reference_on_every_score(compiled, tmp_path, data, budget):
    model_dir = load_model_dir(compiled(data, budget))
    vectors = model_dir.vectors()
    model = families.load_int_model(model_dir)  # rebuilt from model.json alone
    assert np.array_equal(model.scores(vectors.xq), vectors.scores)
    runner = build_host_runner(model_dir.path, tmp_path / "runner", "protonn")
    labels, scores = run_int8(runner, vectors.xq)
    assert scores.shape == vectors.scores.shape
    assert np.array_equal(scores, vectors.scores)  # every element of every vector
    assert np.array_equal(labels, vectors.labels)
    xq, raw_labels, _ = run_raw(runner, vectors.X_raw)
    assert np.array_equal(xq, vectors.xq)  # the input stage in C == InputStage.quantize
    assert np.array_equal(raw_labels, vectors.labels)


def test_report_has_the_documented_keys(compiled):
    report = load_model_dir(compiled("digits", "2kB")).report
    for key in ["model", "dataset", "seed", "budget_bytes", "model_bytes", "ledger", "hyperparameters", "n_test",
                "float_accuracy", "int8_accuracy", "int8_float_agreement"]:
        assert key in report
    assert report["n_test"] == 450
    assert report["int8_accuracy"] > 0.9


@needs("avr-gcc")
def test_avr_gcc_compiles_model_into_flash_not_data(compiled, tmp_path):
    project = compiled("digits", "2kB")
    lib = project / "lib" / "tinyproto"
    flags = ["-mmcu=atmega328p", "-Os", "-std=gnu99", "-Wall", "-Wextra", "-Werror", f"-I{project / 'include'}",
             f"-I{lib}"]
    for source in ["tp_protonn.c", "tp_input.c"]:
        obj = tmp_path / (source + ".o")
        subprocess.run(["avr-gcc", *flags, "-c", str(lib / source), "-o", str(obj)], check=True)
        sizes = subprocess.run(["avr-size", "-A", "-d", str(obj)], capture_output=True, text=True, check=True).stdout
        data = re.search(r"^\.data\s+(\d+)", sizes, re.M)
        assert data is None or int(data.group(1)) == 0, sizes
        if source == "tp_protonn.c":
            progmem = re.search(r"^\.progmem\.data\s+(\d+)", sizes, re.M)
            report = load_model_dir(project).report
            assert progmem and int(progmem.group(1)) == report["model_bytes"], sizes


@pytest.mark.parametrize("family", ["protonn", "flynn"])
def test_two_compiles_are_byte_identical(compiled, tmp_path, family):
    """A compile here against the run's shared compile of the same inputs (conftest's `compiled`: made in another
    process, perhaps on another worker, and read by tests/test_solver_jobs.py too)."""
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    compile_model("wine", CompileOptions(family, "1kB", 0, "uno", tmp_path / "b"))
    outs = [compiled("wine", "1kB", family), tmp_path / "b"]
    files_a = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(outs[1]) for p in outs[1].rglob("*") if p.is_file())
    assert files_a == files_b
    # report.json holds the training wall time, the manifest its sha256, the lock file the writer's pid
    volatile = {"report.json", ".tinyproto", ".tinyproto.lock"}
    for rel in files_a:
        if rel.name not in volatile:
            assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`tinyproto ARGS` in this process (click's runner): its exit status, stdout and stderr. What these tests check
    is the CLI's own refusal (one `error:` line, nothing written); an interpreter start per case (numpy, scikit-learn)
    would cost more than the check. tests/test_data_inputs.py runs such refusals as real processes."""
    result = CliRunner().invoke(main, list(args))
    # a refusal or --help ends in SystemExit; any other exception escaping the verb is a failure here
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


@pytest.mark.parametrize(
    "csv_body,budget",
    [
        ("1,nan,0\n2,3,1\n4,5,0\n6,7,1\n", "2kB"),
        ("1,inf,0\n2,3,1\n4,5,0\n6,7,1\n", "2kB"),
        ("1,red,0\n2,3,1\n4,5,0\n6,7,1\n", "2kB"),
        ("1,2,0\n2,3,0\n4,5,0\n3,3,0\n", "2kB"),
        ("1,2,0\n2,3,1\n4,5,0\n6,7,1\n", "abc"),
        ("1,2,0\n2,3,1\n4,5,0\n6,7,1\n", "0kB"),
        ("1,2,0\n2,3,1\n4,5,0\n6,7,1\n", "20B"),
    ],
)
def test_bad_input_is_one_line_error_and_no_output(tmp_path, csv_body, budget):
    data = tmp_path / "data.csv"
    data.write_text("f1,f2,label\n" + csv_body * 4)  # 16 rows: enough for the 25 % split
    out = tmp_path / "out"
    result = run_cli("compile", str(data), "--budget", budget, "--out", str(out))
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no scratch left behind


def test_too_few_rows_for_the_split(tmp_path):
    data = tmp_path / "tiny.csv"
    data.write_text("f1,f2,label\n1,2,0\n2,3,1\n4,5,0\n6,7,1\n")
    result = run_cli("compile", str(data), "--out", str(tmp_path / "o"))
    assert result.returncode == 1 and "too few samples" in result.stderr


def test_more_classes_than_the_device_apps_frame_holds_are_refused_before_training(tmp_path):
    """255 classes (the data checks' limit) compiled for the Uno, and the build then stopped on tp_app.h's #error:
    the scores of 255 classes (1,100 B of frame) exceed TP_MAX_BUF, half the Uno's SRAM."""
    from tinyproto.core.boards import load_board
    from tinyproto.core.wire import frame_buffer_limit
    from tinyproto.device.project import render_platformio_ini
    from tinyproto.pipeline.compile import refuse_too_many_classes

    uno, mega = load_board("uno"), load_board("mega2560")
    assert f"-DTP_MAX_BUF={frame_buffer_limit(uno.sram_bytes)}" in render_platformio_ini(uno)
    y = np.repeat(np.arange(240), 4)
    X = np.stack([y * 1.0, (y % 7) * 1.0 + np.arange(y.size) % 2], axis=1)
    np.savez(tmp_path / "many.npz", X=X, y=y)
    result = run_cli("compile", str(tmp_path / "many.npz"), "--model", "flynn", "--out", str(tmp_path / "o"))
    assert result.returncode == 1 and "at most 236 classes fit" in result.stderr.splitlines()[-1], result.stderr
    assert not (tmp_path / "o").exists()
    refuse_too_many_classes(236, uno)
    refuse_too_many_classes(255, mega)


def test_too_small_budget_says_the_minimum(tmp_path):
    # a shared input stage fits 300 B
    result = run_cli("compile", "digits", "--budget", "100B", "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    assert re.search(r"needs \d+ B", result.stderr)


def test_unknown_board_and_data(tmp_path):
    assert "unknown board" in run_cli("compile", "iris", "--board", "mega9", "--out", str(tmp_path / "o")).stderr
    assert "neither a built-in" in run_cli("compile", "nosuch", "--out", str(tmp_path / "o")).stderr


def test_help_explains_budget_units():
    result = run_cli("compile", "--help")
    assert result.returncode == 0
    assert "1 kB = 1024 bytes" in result.stdout


def test_wrong_feature_count_at_predict(compiled):
    from tinyproto.core.errors import TinyprotoError

    model = families.load_int_model(load_model_dir(compiled("digits", "2kB")))
    with pytest.raises(TinyprotoError, match="takes 64 features"):
        model.predict(np.zeros((3, 63)))


def test_the_int8_loss_warning_counts_the_rows_behind_its_points():
    from tinyproto.pipeline.compile import int8_loss_warning

    y = np.array([0, 1] * 37)  # 74 test rows, as the warning a 300-row CSV gave
    float_pred = y.copy()
    int8_pred = y.copy()
    assert int8_loss_warning(float_pred, int8_pred, y) is None
    int8_pred[5] = 1 - y[5]
    assert int8_loss_warning(float_pred, int8_pred, y) == (
        "int8 accuracy is 1.4 points below float: 1 more of the 74 test rows wrong after quantization (a larger "
        "--budget or another --model may keep them)")
    float_pred[7] = 1 - y[7]  # the float model wrong on another row: no net loss, no warning
    assert int8_loss_warning(float_pred, int8_pred, y) is None


@pytest.mark.parametrize("fields, words", [
    ({"seed": -1}, r"seed must be in 0\.\.4294967295"), ({"seed": "x"}, "seed must be a whole number"),
    ({"baud": "fast"}, "baud must be a whole number"), ({"max_latency_ms": "x"}, "max_latency_ms must be a number"),
    ({"jobs": "x"}, "jobs must be a whole number"), ({"prefix": 5}, "prefix must be text"),
    ({"out": 123}, "out must be a path"), ({"learnable": "yes"}, "learnable must be True or False"),
    ({"budget": 1.5e3}, "budget must be a size")])
def test_compile_options_of_the_wrong_type_are_one_line(fields, words):
    """CompileOptions from Python: a baud of "fast" was "'<=' not supported between 'str' and 'int'", seed=-1
    numpy's range error from deep in the solver, prefix=5 re's TypeError."""
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.pipeline.compile import CompileOptions

    with pytest.raises(TinyprotoError, match=words):
        CompileOptions(**fields)


def test_compile_model_refuses_wrong_options_and_rates_before_reading_data(tmp_path):
    """compile_model("iris", {"budget": "1kB"}) was an AttributeError; an unknown_rate of 2.0 given as a float
    skipped parse_rate's range and compiled a model declining '200 %' of the rows."""
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    with pytest.raises(TinyprotoError, match="options must be a CompileOptions"):
        compile_model("iris", {"budget": "1kB"})
    with pytest.raises(TinyprotoError, match="unknown rate must be above 0 and at most 50%"):
        compile_model("iris", CompileOptions(budget="512B", unknown_rate=2.0, out=tmp_path / "m"))
    assert not (tmp_path / "m").exists()
