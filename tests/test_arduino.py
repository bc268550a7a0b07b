"""`tinyproto export DIR --arduino`: the Arduino library, its zip, and its example sketch built by the Arduino
IDE's own builder (Debian's arduino-builder + arduino-core-avr, offline) and run on the simulated Uno."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tinyproto.arduino import c_string, check_name, export_arduino, library_name
from tinyproto.cli import main
from tinyproto.errors import TinyprotoError
from tinyproto.modeldir import load_model_dir

ARDUINO_HARDWARE = Path("/usr/share/arduino/hardware")
N_VECTORS = 20
RESULT_RE = re.compile(r"^class (\d+) \((.*)\) score (-?\d+)$")

needs_arduino = pytest.mark.skipif(
    shutil.which("arduino-builder") is None or shutil.which("arduino-ctags") is None
    or not (ARDUINO_HARDWARE / "arduino" / "avr").is_dir(),
    reason="arduino-builder / arduino-core-avr not installed (apt-get install arduino-builder arduino-core-avr)",
)
needs_simavr = pytest.mark.skipif(
    not Path("/usr/include/simavr/sim_avr.h").is_file() or shutil.which("gcc") is None,
    reason="libsimavr-dev or gcc not installed",
)

CASES = {"protonn": ("breast_cancer", "2kB"), "flynn": ("wine", "2kB")}


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, compiled, tmp_path_factory):
    data, budget = CASES[request.param]
    model_dir = compiled(data, budget, request.param)
    out = tmp_path_factory.mktemp(f"arduino-{request.param}") / "export"
    return model_dir, export_arduino(model_dir, out)


def run_cli(*args: str):
    return CliRunner().invoke(main, list(args))


# ------------------------------------------------------------------------------------------------ layout


def test_library_layout(exported):
    model_dir, result = exported
    lib, name = result.library_dir, result.name
    family = load_model_dir(model_dir).meta["family"]
    assert name == library_name(load_model_dir(model_dir).meta["dataset"])
    src = sorted(p.name for p in (lib / "src").iterdir())
    assert src == sorted([f"{name}.h", "tinyproto.h", "tinyproto_model.h", "tp_input.c", "tp_labels.c",
                          "tp_text.c", "tp_text.h", f"tp_{family}.c"])  # never the device app (tp_main.c) nor its serial framing
    assert (lib / "examples" / name / f"{name}.ino").is_file()
    props = dict(line.split("=", 1) for line in (lib / "library.properties").read_text().splitlines() if line)
    assert props["name"] == name and props["architectures"] == "avr" and props["includes"] == f"{name}.h"
    for key in ("version", "author", "maintainer", "sentence", "paragraph", "category", "url"):
        assert props[key], key
    # the model header is the one compile generated for this model (the model directory is the single source)
    assert (lib / "src" / "tinyproto_model.h").read_text() == (model_dir / "include" / "tinyproto_model.h").read_text()
    header = (lib / "src" / f"{name}.h").read_text()
    for api in ("tp_predict(", "tp_input_quantize(", "tp_class_name(", "SRAM:", "Cost:", 'extern "C"'):
        assert api in header, api
    record = json.loads((result.out_dir / "export.json").read_text())
    assert record["model_hash"] == load_model_dir(model_dir).meta["model_hash"] and record["name"] == name


def test_zip_holds_the_library_folder(exported):
    _, result = exported
    name = result.name
    with zipfile.ZipFile(result.zip_path) as archive:
        names = archive.namelist()
        assert {n.split("/", 1)[0] for n in names} == {name}  # one folder at the root, as Add .ZIP Library wants
        assert f"{name}/library.properties" in names
        assert f"{name}/examples/{name}/{name}.ino" in names
        for path in result.library_dir.rglob("*"):
            if path.is_file():
                rel = path.relative_to(result.library_dir.parent).as_posix()
                assert archive.read(rel) == path.read_bytes(), rel
        assert archive.testzip() is None


def test_export_is_reproducible_and_replaces_only_its_own_output(exported, tmp_path):
    model_dir, result = exported
    again = export_arduino(model_dir, tmp_path / "again")
    assert again.zip_path.read_bytes() == result.zip_path.read_bytes()
    export_arduino(model_dir, tmp_path / "again")  # an unchanged earlier export is replaced
    (again.library_dir / "src" / "mine.c").write_text("/* the user's */")
    with pytest.raises(TinyprotoError, match="did not write"):
        export_arduino(model_dir, tmp_path / "again")
    assert (again.library_dir / "src" / "mine.c").exists()


# ------------------------------------------------------------------------------------------------ names


def test_library_names():
    assert library_name("digits") == "TinyprotoDigits"
    assert library_name("breast_cancer") == "TinyprotoBreastCancer"
    assert library_name("my-data.v2 (final)") == "TinyprotoMyDataV2Final"
    assert check_name("My_Model2") == "My_Model2"
    for bad in ("", "2fast", "a-b", "a b", "x" * 64, "tinyproto", "TP_INPUT", "é"):
        with pytest.raises(TinyprotoError):
            check_name(bad)


def test_class_names_are_safe_c_strings():
    assert c_string("setosa") == '"setosa"'
    assert c_string('a"b\\c?') == '"a\\042b\\134c\\077"'
    assert c_string("é\n") == '"\\303\\251\\012"'


# ------------------------------------------------------------------------------------------------ refusals


def test_cli_errors_are_one_line(compiled, tmp_path):
    model_dir = compiled("breast_cancer", "2kB")
    before = sorted(p.name for p in model_dir.iterdir())
    cases = [
        (["export", str(tmp_path), "--arduino"], "not a tinyproto model directory"),
        (["export", str(model_dir), "--arduino", "--name", "9lives"], "is not usable"),
        (["export", str(model_dir), "--arduino", "--out", str(model_dir)], "model directory"),
        (["export", str(model_dir), "--arduino", "--out", str(model_dir / "lib")], "inside it"),
    ]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cases.append((["export", str(model_dir), "--arduino", "--out", str(foreign)], "not empty"))
    for args, message in cases:
        result = run_cli(*args)
        assert result.exit_code == 1, (args, result.output)
        assert message in result.output and result.output.count("\n") == 1, result.output
    assert sorted(p.name for p in model_dir.iterdir()) == before
    assert (foreign / "notes.txt").read_text() == "mine"
    assert run_cli("export", str(model_dir)).exit_code == 2  # no format chosen


def test_damaged_model_is_refused(compiled, tmp_path):
    source = compiled("breast_cancer", "2kB")
    damaged = tmp_path / "damaged"
    shutil.copytree(source, damaged)
    meta = json.loads((damaged / "model.json").read_text())
    meta["int_model"]["proj_shift"] = int(meta["int_model"]["proj_shift"]) + 1
    (damaged / "model.json").write_text(json.dumps(meta))
    result = run_cli("export", str(damaged), "--arduino", "--out", str(tmp_path / "out"))
    assert result.exit_code == 1 and "changed after it was written" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_cli_export(compiled, tmp_path):
    model_dir = compiled("breast_cancer", "2kB")
    result = run_cli("export", str(model_dir), "--arduino", "--out", str(tmp_path / "lib"), "--name", "Tumour")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "lib" / "Tumour" / "src" / "Tumour.h").is_file()
    assert (tmp_path / "lib" / "Tumour.zip").is_file()


# ------------------------------------------------------------------------------------------------ Arduino IDE


def arduino_build(libraries: Path, sketch: Path, build: Path, tools: Path) -> subprocess.CompletedProcess:
    """The Arduino IDE's build, offline (see docs: Debian's arduino-builder needs these prefs with gcc 5.4)."""
    build.mkdir(parents=True, exist_ok=True)
    tools.mkdir(parents=True, exist_ok=True)
    command = [
        "arduino-builder", "-hardware", str(ARDUINO_HARDWARE), "-tools", str(tools), "-libraries", str(libraries),
        "-fqbn", "arduino:avr:uno", "-build-path", str(build),
        "-prefs=tools.ctags.path=/usr/bin", "-prefs=tools.ctags.cmd.path=/usr/bin/arduino-ctags",
        '-prefs=tools.ctags.pattern="{cmd.path}" -u --language-force=c++ -f - --c++-kinds=svpf --fields=KSTtzns '
        '--line-directives "{source_file}"',
        "-prefs=runtime.ide.version=10819", "-prefs=compiler.cpp.extra_flags=-DDECIMAL_DIG=__DECIMAL_DIG__",
        str(sketch),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def float_text(value: np.float32) -> str:
    """The shortest decimal that reads back as the same float32 (numpy's repr): avr-libc's strtod gets about a
    third of these one unit in the last place wrong; the sketch's tp_parse_float must give the host's float."""
    return str(np.float32(value))


@needs_arduino
@needs_simavr
def test_example_sketch_builds_and_matches_the_host_on_the_simulated_uno(exported, tmp_path):
    import serial

    from tinyproto.device.sim import SimulatedUno

    model_dir, result = exported
    name = result.name
    # the sketch folder as a user has it (a copy: the builder never writes into the library)
    sketch = tmp_path / "sketchbook" / name / f"{name}.ino"
    sketch.parent.mkdir(parents=True)
    shutil.copyfile(result.library_dir / "examples" / name / f"{name}.ino", sketch)
    build = arduino_build(result.out_dir, sketch, tmp_path / "build", tmp_path / "tools")
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert "Sketch uses" in build.stdout and "Global variables use" in build.stdout, build.stdout
    objects = sorted(o.name for o in (tmp_path / "build" / "libraries" / name).glob("*.o"))
    assert "tp_input.c.o" in objects and "tp_labels.c.o" in objects, objects  # the library was found and built
    elf = tmp_path / "build" / f"{name}.ino.elf"
    assert elf.is_file()
    sizes = subprocess.run(["avr-size", "-A", "-d", str(elf)], capture_output=True, text=True, check=True).stdout
    ram = sum(int(line.split()[1]) for line in sizes.splitlines() if line.startswith((".data", ".bss")))
    assert ram < 2048 - 512  # the model stays in flash: globals are the core's, the sketch's and the buffers

    vectors = load_model_dir(model_dir).vectors()
    classes = load_model_dir(model_dir).int_model().classes
    n = min(N_VECTORS, len(vectors.labels))
    with SimulatedUno(elf, markers=False) as uno:
        port = serial.Serial(uno.port, 115200, timeout=10)
        for i in range(n):
            line = ", ".join(float_text(v) for v in vectors.X_raw[i])
            port.write((line + "\n").encode())
            reply = port.readline().decode("ascii", "replace").strip()
            while reply and not reply.startswith("class "):  # the start-up banner
                reply = port.readline().decode("ascii", "replace").strip()
            match = RESULT_RE.match(reply)
            assert match, f"vector {i}: unexpected reply {reply!r} ({uno.stderr_text()})"
            label, shown, score = int(match.group(1)), match.group(2), int(match.group(3))
            assert label == int(vectors.labels[i]), f"vector {i}: device {label}, host {vectors.labels[i]}"
            assert score == int(vectors.scores[i][label]), f"vector {i}: score {score} vs {vectors.scores[i]}"
            assert shown == str(classes[label])
        # a line with the wrong count of numbers is answered, not misread
        port.write(b"1, 2, 3\n")
        reply = port.readline().decode("ascii", "replace").strip()
        assert reply == f"error: expected {vectors.X_raw.shape[1]} numbers, got 3", reply
