"""Model prefixes: every external C symbol of a model carries its own prefix (digits_predict, breast_cancer_...), so
several models link into one program: on the host, and in an Arduino sketch built by the Arduino IDE's builder and
by PlatformIO, where each model gives exactly its host reference on the simulated Uno."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyproto import families
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.modeldir import load_model_dir
from tinyproto.core.render import check_prefix, default_prefix, external_symbols, model_sources, write_sources
from tinyproto.device.hostc import HOST_CFLAGS

from arduino_builder import ARDUINO_HARDWARE, arduino_build
from helpers import AVR_FLAGS, accepted, needs, refused, variants

PAIR = {"digits": ("digits", "2kB", "protonn"), "breast_cancer": ("breast_cancer", "2kB", "flynn")}
N_VECTORS = 25  # per model, on the simulated Uno (tools/bench_two_models.py runs every test vector)


# ------------------------------------------------------------------------------------------------ the prefix


def test_default_prefix_is_the_data_sets_name_as_a_c_identifier():
    assert default_prefix("digits") == "digits"
    assert default_prefix("breast_cancer") == "breast_cancer"
    assert default_prefix("my-data.v2 (final)") == "my_data_v2_final"
    assert default_prefix("2020 runs") == "data_2020_runs"
    assert default_prefix("!!!") == "model" and default_prefix("TP") == "model"
    assert len(default_prefix("x" * 100)) <= 24
    for name in ("digits", "Breast Cancer", "a--b", "9", "_x_", "é", "x" * 40):
        assert check_prefix(default_prefix(name)) == default_prefix(name)


@pytest.mark.parametrize("bad", ["", "Digits", "9lives", "a-b", "a__b", "a_", "_a", "tp", "x" * 25, "é"])
def test_a_bad_prefix_is_refused(bad):
    with pytest.raises(TinyprotoError, match="prefix"):
        check_prefix(bad)


def test_cli_refuses_a_bad_prefix_in_one_line_before_any_work(work, compiled):
    refused(["compile", "iris", "--budget", "1kB", "--prefix", "Iris"], "lower-case C identifier", work)
    model = compiled("iris", "1kB")
    refused(["export", str(model), "--arduino", "--out", str(work / "x"), "--prefix", "a-b"], "--prefix", work)


def test_compile_records_the_prefix_and_the_header_uses_it(work):
    accepted(["compile", "iris", "--budget", "512B", "--prefix", "flower", "--out", "m"])
    meta = load_model_dir(work / "m").meta
    assert meta["prefix"] == "flower"
    header = (work / "m" / "include" / "tinyproto_model.h").read_text()
    assert "#define tp_predict flower_predict" in header and "#define TP_MODEL_PREFIX flower" in header


# ------------------------------------------------------------------------------------------------ symbols


def defined_globals(objects: list[Path], nm: str) -> set[str]:
    out = subprocess.run([nm, "-g", "--defined-only", *map(str, objects)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if len(line.split()) == 3}


def runtime_objects(model, where: Path, prefix: str, cc: list[str]) -> list[Path]:
    write_sources(model, where, "test", 0, 1 << 20, prefix=prefix)
    lib = where / "lib" / "tinyproto"
    objects = []
    for source in model_sources(model.family):
        obj = where / f"{source}.o"
        subprocess.run([*cc, f"-I{where / 'include'}", f"-I{lib}", "-c", str(lib / source), "-o", str(obj)],
                       check=True)
        objects.append(obj)
    return objects


@needs("gcc")
def test_every_external_symbol_of_every_layout_carries_the_prefix_on_the_host(compiled, tmp_path):
    """Every family and W layout: what the compiled runtime defines for the linker is exactly the prefixed
    external_symbols() (the header renames all of them, and nothing else reaches the linker)."""
    for i, model in enumerate(variants(compiled)):
        objects = runtime_objects(model, tmp_path / f"v{i}", "mdl", ["gcc", *HOST_CFLAGS])
        defined = defined_globals(objects, "nm")
        assert all(name.startswith("mdl_") for name in defined), (model.family, i, sorted(defined))
        assert defined <= {f"mdl_{name[3:]}" for name in external_symbols(model)}, (model.family, i)


@pytest.mark.device
@needs("avr-gcc")
@needs("avr-nm")
def test_every_external_symbol_carries_the_prefix_on_the_avr(compiled, tmp_path):
    """The same with avr-gcc, whose AVR kernel twins are other code."""
    for name in families.names():
        model = families.load_int_model(load_model_dir(compiled("iris", "1kB", name)))
        objects = runtime_objects(model, tmp_path / name, "mdl", ["avr-gcc", *AVR_FLAGS])
        defined = defined_globals(objects, "avr-nm")
        assert defined and all(symbol.startswith("mdl_") for symbol in defined), (name, sorted(defined))


HOST_PAIR_MAIN = """#include <stdio.h>
#include <stdint.h>
{prototypes}
int main(int argc, char **argv) {{
    int8_t x[4096]; int32_t scores[64]; int which = argv[1][0] - '0'; size_t n = (size_t)atoi(argv[2]); (void)argc;
    while (fread(x, 1, n, stdin) == n) {{
        uint8_t label = 0; int classes = 0;
{calls}
        printf("%u", label);
        for (int i = 0; i < classes; i++) printf(" %ld", (long)scores[i]);
        printf("\\n");
    }}
    return 0;
}}
"""


@needs("gcc")
def test_models_of_one_family_and_of_two_link_into_one_host_program(compiled, tmp_path):
    """Three models, two of them ProtoNN, in one executable: it links (no symbol defined twice) and each model
    gives exactly its own host reference."""
    dirs = {"first": compiled("iris", "1kB"), "second": compiled("breast_cancer", "2kB"),
            "third": compiled("wine", "2kB", "flynn")}
    objects, prototypes, calls, models = [], [], [], []
    for k, (prefix, model_dir) in enumerate(dirs.items()):
        model = families.load_int_model(load_model_dir(model_dir))
        models.append(model)
        objects += runtime_objects(model, tmp_path / prefix, prefix, ["gcc", *HOST_CFLAGS])
        prototypes.append(f"uint8_t {prefix}_predict(const int8_t *x, int32_t *scores);")
        calls.append(f"        if (which == {k}) {{ label = {prefix}_predict(x, scores); "
                     f"classes = {model.n_classes}; }}")
    main_c = tmp_path / "main.c"
    main_c.write_text("#include <stdlib.h>\n" + HOST_PAIR_MAIN.format(prototypes="\n".join(prototypes),
                                                                       calls="\n".join(calls)))
    exe = tmp_path / "pair"
    subprocess.run(["gcc", *HOST_CFLAGS, str(main_c), *map(str, objects), "-lm", "-o", str(exe)], check=True)
    rng = np.random.default_rng(4)
    for k, model in enumerate(models):
        xq = rng.integers(-127, 128, size=(50, model.n_features)).astype(np.int8)
        out = subprocess.run([str(exe), str(k), str(model.n_features)], input=xq.tobytes(), capture_output=True,
                             check=True).stdout.decode()
        rows = np.array([line.split() for line in out.splitlines()], dtype=np.int64)
        scores = np.asarray(model.scores(xq))
        np.testing.assert_array_equal(rows[:, 1:], scores)
        np.testing.assert_array_equal(rows[:, 0], model.labels(scores))


# ------------------------------------------------------------------------------------------------ the Arduino sketch


needs_arduino = pytest.mark.skipif(
    shutil.which("arduino-builder") is None or not (ARDUINO_HARDWARE / "arduino" / "avr").is_dir(),
    reason="arduino-builder / arduino-core-avr not installed (apt-get install arduino-builder arduino-core-avr)")


@pytest.fixture(scope="module")
def pair(compiled, tmp_path_factory):
    """(`tinyproto export A B --arduino` of the two models, {prefix: (model directory, its library)})."""
    from tinyproto.pipeline.arduino import export_arduino_models

    model_dirs = {prefix: compiled(*args) for prefix, args in PAIR.items()}
    result = export_arduino_models(list(model_dirs.values()), tmp_path_factory.mktemp("pair") / "models-arduino")
    return result, {prefix: (model_dirs[prefix], library) for prefix, library in zip(PAIR, result.libraries)}


def test_an_export_of_several_models_writes_each_library_and_one_sketch(pair):
    result, models = pair
    assert sorted(p.name for p in result.out_dir.iterdir() if not p.name.startswith(".tinyproto")) == sorted(
        ["Models", "TinyprotoBreastCancer", "TinyprotoBreastCancer.zip", "TinyprotoDigits", "TinyprotoDigits.zip",
         "export.json", "platformio.ini"])
    sketch = result.sketch.read_text()
    for prefix in PAIR:
        assert f"{prefix}_predict(x, scores)" in sketch and f"#include <{models[prefix][1].name}.h>" in sketch
    ini = (result.out_dir / "platformio.ini").read_text()
    assert "src_dir = Models" in ini and "    symlink://TinyprotoDigits\n    symlink://TinyprotoBreastCancer" in ini


def test_an_export_of_several_models_refuses_a_prefix_twice(work, compiled):
    first = compiled("iris", "1kB")
    second = compiled("iris", "1kB", "flynn")
    refused(["export", str(first), str(second), "--arduino", "--out", str(work / "x")], "--prefix", work)
    refused(["export", str(first), str(second), "--arduino", "--prefix", "a"], "one model", work)


def test_an_export_of_the_same_model_twice_says_so(work, compiled):
    """The same directory twice was refused as "A and A have the C prefix 'iris'; compile one of them again"."""
    model = compiled("iris", "1kB")
    (work / "link").symlink_to(model)
    refused(["export", str(model), str(model), "--out", str(work / "x")], f"{model} is given twice", work)
    refused(["export", str(model), str(work / "link"), "--out", str(work / "x")], "are the same directory", work)


def test_the_exported_headers_name_each_model_by_its_prefix(pair):
    for prefix, (_, export) in pair[1].items():
        header = (export.library_dir / "src" / f"{export.name}.h").read_text()
        for api in (f"uint8_t {prefix}_predict(", f"void {prefix}_input_quantize(", f"{prefix}_class_name(",
                    f"#define {prefix.upper()}_N_FEATURES", f"#define tp_predict {prefix}_predict"):
            assert api in header, (prefix, api)
        assert '#include "tinyproto_model.h"' not in header  # the sketch never sees the runtime's TP_ macros


RESULT = re.compile(r"^(\w+) class (\d+) \((.*)\) scores (-?\d+(?: -?\d+)*)$")


def check_pair_on_simulated_uno(elf: Path, models: dict, n_vectors: int = N_VECTORS) -> None:
    """Each model's first test vectors as text lines: every label and every score must be its host reference's."""
    import serial

    from tinyproto.device.sim import SimulatedUno

    with SimulatedUno(elf, markers=False) as uno:
        port = serial.Serial(uno.port, 115200, timeout=20)
        for prefix, (model_dir, _) in models.items():
            vectors = load_model_dir(model_dir).vectors()
            classes = families.load_int_model(load_model_dir(model_dir)).classes
            for i in range(min(n_vectors, len(vectors.labels))):
                numbers = ", ".join(str(np.float32(v)) for v in vectors.X_raw[i])
                port.write(f"{prefix} {numbers}\n".encode())
                reply = port.readline().decode("ascii", "replace").strip()
                while reply and not reply.startswith(prefix):  # (the start-up banner, from wherever it was caught)
                    reply = port.readline().decode("ascii", "replace").strip()
                match = RESULT.match(reply)
                assert match and match.group(1) == prefix, f"{prefix} vector {i}: {reply!r} ({uno.stderr_text()})"
                assert int(match.group(2)) == int(vectors.labels[i]), (prefix, i, reply)
                assert [int(s) for s in match.group(4).split()] == vectors.scores[i].tolist(), (prefix, i, reply)
                assert match.group(3) == str(classes[int(match.group(2))])
        port.write(b"digits 1, 2\n")
        digits = load_model_dir(models["digits"][0]).vectors().X_raw.shape[1]
        assert port.readline().decode().strip() == f"error: expected {digits} numbers, got 2"


def flash_and_sram(elf: Path) -> tuple[int, int]:
    sizes = subprocess.run(["avr-size", "-A", "-d", str(elf)], capture_output=True, text=True, check=True).stdout
    sections = {line.split()[0]: int(line.split()[1]) for line in sizes.splitlines() if line.startswith(".")}
    return sections.get(".text", 0) + sections.get(".data", 0), sections.get(".data", 0) + sections.get(".bss", 0)


@pytest.mark.device
@pytest.mark.slow
@needs_arduino
@needs("avr-size")
def test_two_models_in_one_sketch_arduino_builder(pair, tmp_path):
    """The generated sketch as a user has it, the export's folder as the IDE's libraries folder."""
    result, models = pair
    sketch = tmp_path / "Models" / "Models.ino"
    sketch.parent.mkdir()
    shutil.copyfile(result.sketch, sketch)
    build = arduino_build(result.out_dir, sketch, tmp_path / "build", tmp_path / "tools")
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    elf = tmp_path / "build" / "Models.ino.elf"
    objects = {o.name for o in (tmp_path / "build" / "libraries").rglob("*.o")}  # both libraries were built
    assert {"tp_input.c.o", "tp_protonn.c.o", "tp_flynn.c.o", "tp_text.c.o"} <= objects, objects
    check_pair_on_simulated_uno(elf, models)


@pytest.mark.device
@pytest.mark.slow
@needs_arduino  # (framework = arduino offline is Debian's Arduino core)
@pytest.mark.skipif(shutil.which("avr-gcc") is None, reason="avr-gcc not installed")
def test_two_models_in_one_sketch_platformio(pair, private_cache, tmp_path):
    """The export's own platformio.ini: both libraries in lib_deps, the generated sketch as the source."""
    import importlib.util

    if importlib.util.find_spec("platformio") is None:
        pytest.skip("PlatformIO not installed")
    from tinyproto.device.build import pio_environment, prepare_pio_core

    result, models = pair
    project = tmp_path / "project"
    shutil.copytree(result.out_dir, project, symlinks=True)
    run = subprocess.run([sys.executable, "-m", "platformio", "run", "-d", str(project)],
                         env=pio_environment(prepare_pio_core()), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for _, library in models.values():
        assert f"{library.name} @ " in run.stdout  # the dependency finder found both libraries
    check_pair_on_simulated_uno(project / ".pio" / "build" / "uno_offline" / "firmware.elf", models)
