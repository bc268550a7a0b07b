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

from tinyproto.pipeline.arduino import c_string, check_name, export_arduino, library_name
from tinyproto.cli import main
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.modeldir import load_model_dir
from tinyproto import families

from arduino_builder import ARDUINO_HARDWARE, arduino_build
from helpers import accepted, refused

N_VECTORS = 20
RESULT_RE = re.compile(r"^(unknown: closest )?class (\d+) \((.*)\) score (-?\d+) confidence (\d+)$")

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
    assert src == sorted([f"{name}.h", "tinyproto.h", "tinyproto_model.h", "tp_avr.h", "tp_input.c", "tp_judge.c",
                          "tp_judge_avr.h", "tp_labels.c", "tp_text.c", "tp_text.h", f"tp_{family}.c",
                          f"tp_{family}_avr.h"])
    # never the device app (tp_main.c) nor its serial framing (tp_serial.*): the user's sketch is the app
    assert (lib / "examples" / name / f"{name}.ino").is_file()
    props = dict(line.split("=", 1) for line in (lib / "library.properties").read_text().splitlines() if line)
    assert props["name"] == name and props["architectures"] == "avr" and props["includes"] == f"{name}.h"
    for key in ("version", "author", "maintainer", "sentence", "paragraph", "category"):
        assert props[key], key
    assert "url" in props  # (empty: the project has no public address to give)
    # the model header is the one compile generated for this model (the model directory is the single source)
    assert (lib / "src" / "tinyproto_model.h").read_text() == (model_dir / "include" / "tinyproto_model.h").read_text()
    header = (lib / "src" / f"{name}.h").read_text()
    for api in ("tp_predict(", "tp_classify(", "tp_input_quantize(", "tp_class_name(", "SRAM:", "Cost:", 'extern "C"'):
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
    build = tmp_path / "again" / ".pio" / "build" / "uno_offline"  # what `pio run` in the export writes
    build.mkdir(parents=True)
    (build / "firmware.hex").write_text(":00000001FF\n")
    export_arduino(model_dir, tmp_path / "again")  # the example's build is the export's own: replaced too
    assert not (tmp_path / "again" / ".pio").exists()
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


def test_arduino_is_the_default_format(compiled, tmp_path):
    """`tinyproto export DIR` ended in click's "Missing option '--arduino'" although it is the only format."""
    model_dir = compiled("breast_cancer", "2kB")
    for out, flag in (("plain", []), ("flagged", ["--arduino"])):
        result = run_cli("export", str(model_dir), *flag, "--out", str(tmp_path / out))
        assert result.exit_code == 0, result.output
    library = sorted((tmp_path / "plain").rglob("*.h"))
    assert library and [p.read_bytes() for p in library] == [
        (tmp_path / "flagged" / p.relative_to(tmp_path / "plain")).read_bytes() for p in library]


def test_cli_export_names_its_files_as_the_user_typed_them(compiled, tmp_path, monkeypatch):
    """Paths under the current directory are shown relative (build/wine-arduino/..., as the docs show them), not
    resolved to absolute ones."""
    model_dir = compiled("breast_cancer", "2kB")
    monkeypatch.chdir(tmp_path)
    result = run_cli("export", str(model_dir), "--arduino", "--out", "lib", "--name", "Tumour")
    assert result.exit_code == 0, result.output
    assert "wrote Arduino library Tumour: lib/Tumour\n" in result.output
    assert "Add .ZIP Library): lib/Tumour.zip\n" in result.output and str(tmp_path) not in result.output


# ------------------------------------------------------------------------------------------------ Arduino IDE


def float_text(value: np.float32) -> str:
    """The shortest decimal that reads back as the same float32 (numpy's repr): avr-libc's strtod gets about a
    third of these one unit in the last place wrong; the sketch's tp_parse_float must give the host's float."""
    return str(np.float32(value))


def check_on_simulated_uno(elf: Path, model_dir: Path, n_vectors: int = N_VECTORS) -> None:
    """Feed the first test vectors to the example sketch as text lines; every printed label and score must be
    the host reference's."""
    import serial

    from tinyproto.device.sim import SimulatedUno

    vectors = load_model_dir(model_dir).vectors()
    classes = families.load_int_model(load_model_dir(model_dir)).classes
    n = min(n_vectors, len(vectors.labels))
    with SimulatedUno(elf, markers=False) as uno:
        port = serial.Serial(uno.port, 115200, timeout=10)
        for i in range(n):
            line = ", ".join(float_text(v) for v in vectors.X_raw[i])
            port.write((line + "\n").encode())
            reply = port.readline().decode("ascii", "replace").strip()
            while reply and not reply.startswith(("class ", "unknown")):  # the start-up banner
                reply = port.readline().decode("ascii", "replace").strip()
            match = RESULT_RE.match(reply)
            assert match, f"vector {i}: unexpected reply {reply!r} ({uno.stderr_text()})"
            label, shown, score = int(match.group(2)), match.group(3), int(match.group(4))
            assert label == int(vectors.labels[i]), f"vector {i}: device {label}, host {vectors.labels[i]}"
            assert int(match.group(5)) == int(vectors.confidence[i]), f"vector {i}: confidence {match.group(5)}"
            assert bool(match.group(1)) == (int(vectors.decided[i]) == 255), f"vector {i}: unknown differs"
            assert score == int(vectors.scores[i][label]), f"vector {i}: score {score} vs {vectors.scores[i]}"
            assert shown == str(classes[label])
        # a line with the wrong count of numbers is answered, not misread
        port.write(b"1, 2, 3\n")
        reply = port.readline().decode("ascii", "replace").strip()
        assert reply == f"error: expected {vectors.X_raw.shape[1]} numbers, got 3", reply


@needs_arduino
@needs_simavr
def test_example_sketch_builds_and_matches_the_host_on_the_simulated_uno(exported, tmp_path):
    model_dir, result = exported
    name = result.name
    # the sketch folder as a user has it (a copy: the builder never writes into the library)
    sketch = tmp_path / "sketchbook" / name / f"{name}.ino"
    sketch.parent.mkdir(parents=True)
    shutil.copyfile(result.library_dir / "examples" / name / f"{name}.ino", sketch)
    # the library as the IDE installs it from the zip (Add .ZIP Library unpacks it into libraries/)
    libraries = tmp_path / "libraries"
    with zipfile.ZipFile(result.zip_path) as archive:
        archive.extractall(libraries)
    build = arduino_build(libraries, sketch, tmp_path / "build", tmp_path / "tools")
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert "Sketch uses" in build.stdout and "Global variables use" in build.stdout, build.stdout
    objects = sorted(o.name for o in (tmp_path / "build" / "libraries" / name).glob("*.o"))
    assert "tp_input.c.o" in objects and "tp_labels.c.o" in objects, objects  # the library was found and built
    elf = tmp_path / "build" / f"{name}.ino.elf"
    assert elf.is_file()
    sizes = subprocess.run(["avr-size", "-A", "-d", str(elf)], capture_output=True, text=True, check=True).stdout
    ram = sum(int(line.split()[1]) for line in sizes.splitlines() if line.startswith((".data", ".bss")))
    assert ram < 2048 - 512  # the model stays in flash: globals are the core's, the sketch's and the buffers

    check_on_simulated_uno(elf, model_dir)


@needs_arduino
@needs_simavr
@pytest.mark.skipif(shutil.which("avr-gcc") is None, reason="avr-gcc not installed")
def test_example_builds_with_platformio_framework_arduino_offline(exported, private_cache):
    """The export's own platformio.ini, offline: `framework = arduino` on tinyproto's dev-platform with Debian's core
    (env <board>_offline, the default), the example sketch as the source, the library by lib_deps; then the
    simulated Uno runs it."""
    import importlib.util
    import sys

    if importlib.util.find_spec("platformio") is None:
        pytest.skip("PlatformIO not installed")
    from tinyproto.device.build import pio_environment, prepare_pio_core

    model_dir, result = exported
    ini = (result.out_dir / "platformio.ini").read_text()
    assert "framework = arduino" in ini and f"lib_deps = symlink://{result.name}" in ini
    project = result.out_dir
    run = subprocess.run([sys.executable, "-m", "platformio", "run", "-d", str(project)],
                         env=pio_environment(prepare_pio_core()), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{result.name} @ " in run.stdout  # PlatformIO's dependency finder found the library
    check_on_simulated_uno(project / ".pio" / "build" / "uno_offline" / "firmware.elf", model_dir)
    # the build wrote nothing into the library (what the zip holds)
    assert sorted(p.name for p in (result.library_dir / "examples" / result.name).iterdir()) == [f"{result.name}.ino"]


# ------------------------------------------------------------------------------------------------ text -> float32


def nearest_float32_bits(text: str) -> int:
    """The float32 nearest to the decimal `text` (ties to even, subnormals, overflow to inf), exactly."""
    import math
    from fractions import Fraction

    q = Fraction(text.strip())
    sign = 0x80000000 if text.strip().startswith("-") else 0  # -0 too
    q = abs(q)
    if q == 0:
        return sign
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    if e > 127:
        return sign | 0x7F800000
    precision = 24 if e >= -126 else 24 - (-126 - e)
    if precision < 0:
        return sign | (1 if q > Fraction(2) ** -150 else 0)
    scaled = q / Fraction(2) ** (e - precision + 1)
    m = math.floor(scaled)
    rest = scaled - m
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and m % 2):
        m += 1
    if e < -126:
        return sign | m  # a subnormal (m = 2^23 is the smallest normal: the same bits)
    if m == 1 << 24:
        m, e = m >> 1, e + 1
    if e > 127:
        return sign | 0x7F800000
    return sign | ((e + 127) << 23) | (m & 0x7FFFFF)


def parse_cases(n_random: int) -> list[str]:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 4 * n_random, dtype=np.uint64).astype(np.uint32)
    floats = bits.view(np.float32)
    floats = floats[np.isfinite(floats)][:n_random]
    scaled = (rng.standard_normal(n_random) * 10.0 ** rng.integers(-8, 9, n_random)).astype(np.float32)
    texts = [str(v) for v in floats] + [str(v) for v in scaled] + ["%.9g" % float(v) for v in scaled[: n_random // 4]]
    texts += ["%.17g" % ((float(v) + float(np.nextafter(v, np.float32(np.inf)))) / 2) for v in scaled[:50]]  # ~ties
    texts += ["0", "-0", "1", "0.1", "16777217", "16777219", "3.4028235e38", "3.4028236e38", "1e39", "1e-45",
              "7.006492321624085e-46", "7.006492321624086e-46", "1.1754942e-38", "-2.5e+3", "+3.5", "1e-1000",
              "1e1000", "0.000000000000000000000000000000000000000000001", "123456789012345678901234567890123456789"]
    return texts


def test_parse_float_is_correctly_rounded_on_the_host(tmp_path):
    """tp_parse_float compiled for the host (the same C as on the Uno) against exact rational rounding."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    from tinyproto.core.resources import resource_dir

    folder = resource_dir("templates") / "arduino"
    driver = tmp_path / "driver.c"
    driver.write_text('#include <stdio.h>\n#include <string.h>\n#include <stdint.h>\n#include "tp_text.h"\n'
                      "int main(void) { char line[256]; while (fgets(line, sizeof line, stdin)) {\n"
                      '  const char *end; float f = tp_parse_float(line, &end); uint32_t u; memcpy(&u, &f, 4);\n'
                      '  printf("%08lx %c\\n", (unsigned long)u, *end == 10 ? 39 : 63); } return 0; }\n')
    exe = tmp_path / "parse"
    subprocess.run(["gcc", "-O2", "-std=c99", "-Wall", "-Werror", f"-I{folder}", "-o", str(exe), str(driver),
                    str(folder / "tp_text.c")], check=True)
    texts = parse_cases(3000)
    out = subprocess.run([str(exe)], input="\n".join(texts) + "\n", capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == len(texts)
    for text, line in zip(texts, lines):
        got, ended = line.split()
        assert int(got, 16) == nearest_float32_bits(text), text
        assert ended == "'", f"{text}: the number did not end at the end of the line"


PARSE_SKETCH = """#include <{name}.h>
char line[48];
int length = 0;
void setup() {{ Serial.begin(115200); }}
void loop() {{
  int c = Serial.read();
  if (c < 0) return;
  if (c != '\\n') {{ if (length < 47) line[length++] = (char)c; return; }}
  line[length] = 0;
  length = 0;
  float f = tp_parse_float(line, NULL);
  uint32_t bits;
  memcpy(&bits, &f, 4);
  Serial.println(bits, HEX);
}}
"""


@needs_arduino
@needs_simavr
def test_parse_float_is_correctly_rounded_on_the_simulated_uno(exported, tmp_path):
    """The same check on the Uno, built with the Arduino IDE's flags (-Os, LTO): the code the user runs."""
    import serial

    from tinyproto.device.sim import SimulatedUno

    model_dir, result = exported
    if load_model_dir(model_dir).meta["family"] != "protonn":
        pytest.skip("one family is enough: tp_parse_float does not depend on the model")
    sketch = tmp_path / "ParseCheck" / "ParseCheck.ino"
    sketch.parent.mkdir()
    sketch.write_text(PARSE_SKETCH.format(name=result.name))
    build = arduino_build(result.out_dir, sketch, tmp_path / "build", tmp_path / "tools")
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    data_values = np.unique(load_model_dir(model_dir).vectors().X_raw.astype(np.float32).ravel())[:400]
    texts = [str(v) for v in data_values] + parse_cases(150)
    with SimulatedUno(tmp_path / "build" / "ParseCheck.ino.elf", markers=False) as uno:
        port = serial.Serial(uno.port, 115200, timeout=10)
        for text in texts:
            port.write((text + "\n").encode())
            reply = port.readline().decode("ascii", "replace").strip()
            assert int(reply, 16) == nearest_float32_bits(text), f"{text}: device {reply}"


def test_export_record_names_the_model_relative_to_the_export(exported):
    """export.json holds no absolute path: moving the model and its export together keeps the record true."""
    model_dir, result = exported
    record = json.loads((result.out_dir / "export.json").read_text())
    assert not Path(record["model_dir"]).is_absolute()
    assert (result.out_dir / record["model_dir"]).resolve() == Path(model_dir).resolve()
# ----------------------------------------------------------------------------------- what the library is made from


def export_to_sibling(model: Path) -> list[str]:
    return ["export", str(model), "--arduino", "--out", str(model.parent / "exported")]


@pytest.mark.parametrize("total", ["Infinity", "NaN", "1e300", "[1, 2]", '"fast"', "true"])
def test_export_leaves_out_a_cycle_figure_report_json_cannot_hold(work, compiled, total):
    """report.json is not hashed; an infinite predicted cycle count was an internal error (int(inf))."""
    model = compiled("iris", "1kB")
    path = model / "report.json"
    report = json.loads(path.read_text())
    report["predicted_cycles"] = {"total": "@@"}
    path.write_text(json.dumps(report).replace('"@@"', total))
    accepted(export_to_sibling(model))
    library_h = next((model.parent / "exported").rglob("TinyprotoIris.h")).read_text()
    assert "Cost: about" not in library_h  # the figure is left out, not printed as inf, nan or text


def test_a_data_set_name_that_gives_no_library_name_says_so(work, compiled):
    """It blamed a `--name 'Tinyproto'` that nobody gave."""
    model = compiled("iris", "1kB")
    meta = json.loads((model / "model.json").read_text())
    meta["dataset"] = "!!!"
    (model / "model.json").write_text(json.dumps(meta))
    refused(export_to_sibling(model), "give one with --name", model.parent, own_files_at_root=True)
