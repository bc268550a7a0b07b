"""The facts each family declares (tinyproto.families.Family: which score wins, static state, reentrancy,
streaming, learning) are true of its host reference and of its C runtime as avr-gcc builds it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import needs
from helpers import compiled_model, variants

from tinyproto import families
from tinyproto.core.modeldir import load_model_dir
from tinyproto.core.render import family_runtime, write_sources

AVR_FLAGS = ["-mmcu=atmega328p", "-Os", "-std=c99", "-ffunction-sections", "-fdata-sections"]
PREDICT_ONLY_MAIN = """#include "tinyproto.h"
#include "tinyproto_model.h"
int main(void) { int8_t x[TP_N_FEATURES] = {0}; int32_t scores[TP_N_CLASSES]; return tp_predict(x, scores); }
"""






def label_rule(wins: str, scores: np.ndarray) -> np.ndarray:
    """The label a score rule gives: the first highest (or lowest) score, so ties go to the lowest index."""
    return np.argmax(scores, axis=1) if wins == families.HIGHEST else np.argmin(scores, axis=1)


def test_every_family_declares_its_facts():
    for name in families.names():
        fam = families.family(name)
        assert fam.score.wins in (families.HIGHEST, families.LOWEST) and fam.score.meaning, name
        assert callable(fam.static_state), name
        assert fam.learnable == (fam.learning is not None), name
        assert families.estimator_class(fam.estimator.rpartition(":")[2]) is not None, name


@pytest.mark.parametrize("name", families.names())
def test_the_declared_score_rule_is_how_the_host_reference_labels(compiled, name):
    model = compiled_model(compiled, name)
    rng = np.random.default_rng(1)
    xq = rng.integers(-127, 128, size=(300, model.n_features)).astype(np.int8)
    scores = model.scores(xq)
    np.testing.assert_array_equal(model.labels(scores), label_rule(families.family(name).score.wins, scores))
    # ties, whatever the inputs give: every class equal -> class 0
    np.testing.assert_array_equal(model.labels(np.zeros((1, model.n_classes), dtype=np.int64)), [0])


@needs("gcc")
@pytest.mark.parametrize("name", families.names())
def test_the_declared_score_rule_is_how_the_c_runtime_labels(compiled, tmp_path, name):
    from tinyproto.device.hostc import build_host_runner, run_int8

    model_dir = compiled("iris", "1kB", name)
    model = families.load_int_model(load_model_dir(model_dir))
    xq = np.random.default_rng(2).integers(-127, 128, size=(200, model.n_features)).astype(np.int8)
    labels, scores = run_int8(build_host_runner(model_dir, tmp_path / "runner", name), xq)
    np.testing.assert_array_equal(labels, label_rule(families.family(name).score.wins, scores))


def static_bytes(path: Path) -> int:
    """.bss + .data bytes of an AVR object or ELF (avr-size -A), every section of either kind, and an object's
    common symbols (avr-nm: a global defined without an initialiser, e.g. Bloom features' tp_range_signal, which
    the link puts in .bss)."""
    out = subprocess.run(["avr-size", "-A", str(path)], capture_output=True, text=True, check=True).stdout
    sections = sum(int(parts[1]) for parts in (line.split() for line in out.splitlines())
                   if parts and parts[0].startswith((".bss", ".data")))
    symbols = subprocess.run(["avr-nm", "-S", str(path)], capture_output=True, text=True, check=True).stdout
    return sections + sum(int(parts[1], 16) for parts in (line.split() for line in symbols.splitlines())
                          if len(parts) == 4 and parts[2] == "C")


@pytest.mark.device
@needs("avr-gcc")
@needs("avr-size")
def test_the_declared_static_state_is_what_avr_gcc_lays_out(compiled, tmp_path):
    """The runtime file's static bytes equal the declared StaticState; a program that calls tp_predict alone
    (unused code and data dropped by the linker, as in an Arduino sketch) keeps exactly the declared `predict`
    part, so a family declared reentrant really keeps nothing static in tp_predict."""
    seen = set()
    for i, model in enumerate(variants(compiled)):
        state = families.family_of(model).static_state(model)
        project = tmp_path / f"m{i}"
        write_sources(model, project, "facts", 0, 1 << 20)
        lib = project / "lib" / "tinyproto"
        flags = ["avr-gcc", *AVR_FLAGS, f"-I{project / 'include'}", f"-I{lib}"]
        runtime = lib / family_runtime(model.family)
        subprocess.run([*flags, "-c", str(runtime), "-o", str(project / "runtime.o")], check=True)
        assert static_bytes(project / "runtime.o") == state.nbytes, (model.family, i, state)
        (project / "main.c").write_text(PREDICT_ONLY_MAIN)
        subprocess.run([*flags, str(project / "main.c"), str(runtime), "-Wl,--gc-sections", "-o",
                        str(project / "predict.elf")], check=True)
        assert static_bytes(project / "predict.elf") == sum(item.nbytes for item in state.predict), (model.family, i)
        seen.add((model.family, state.reentrant, state.nbytes > 0))
    # the variants cover both answers where a family has both (ProtoNN: row-major W reentrant, streamed W not)
    assert {("protonn", True, True), ("protonn", False, True), ("flynn", True, False), ("bnc", True, True),
            ("bloom", False, True)} <= seen


def test_streaming_and_learning_facts_match_the_models(compiled):
    for name in families.names():
        fam = families.family(name)
        model = compiled_model(compiled, name)
        if model.defines().get("TP_STREAMABLE", 0):
            assert fam.streamable, name  # a model streams only if its family says its models can
        if not fam.streamable:
            assert not families.family_of(model).static_state(model).stream_only, name
