"""The C kernels: every family's portable reference and its AVR-optimised twins give the host reference's integers.

Each family's runtime is tp_<family>.c (family logic and the portable C99 reference kernels) plus tp_<family>_avr.h
(the AVR twins); firmware/tinyproto.h chooses between them (TP_KERNELS_AVR, -DTP_FORCE_REFERENCE). For a set of
models of every registered family, shapes where the twins run and shapes where they decline, at the int8 extremes,
three builds must each give IntModel.scores() for every vector, score for score:
  - the reference compiled for the host (gcc -std=c99 -pedantic -Werror),
  - the default AVR firmware (the twins) on the simulated Uno,
  - the reference compiled for the AVR (-DTP_FORCE_REFERENCE) on the simulated Uno.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tinyproto import families
from tinyproto.core.inputstage import InputStage

from conftest import needs

FIRMWARE = Path(__file__).resolve().parent.parent / "firmware"

pytestmark = [pytest.mark.usefixtures("private_cache")]

HAVE_SIM = os.path.exists("/usr/include/simavr/sim_avr.h")


def extreme_vectors(d: int, rng: np.random.Generator, n_random: int = 4) -> np.ndarray:
    """The int8 extremes (every input at +127, at -128, alternating, at -127) and a few random vectors."""
    rows = [np.full(d, 127), np.full(d, -128), np.where(np.arange(d) % 2, 127, -128), np.full(d, -127)]
    rows += [rng.integers(-128, 128, size=d) for _ in range(n_random)]
    return np.array(rows, dtype=np.int8)


# ---- models of each family: (case name, builder(rng) -> integer model) -----------------------------------------

def _protonn(d, D, m, L, *, w="random", density=1.0, per_column=0, b="random", z="random", proj_shift=7,
             table_size=32):
    """A ProtoNN whose values sit at the int8 limits on request (per_column > 0: exactly that many nonzeros in each
    column of W, which makes a column-major code the smallest encoding), with a kernel table that reaches the
    distances the vectors give (so the scores carry every projection and distance bit)."""
    from dataclasses import replace

    from tinyproto.families.protonn.quantize import IntProtoNN, kernel_table

    def build(rng):
        def fill(kind, shape):
            return {"random": lambda: rng.integers(-127, 128, size=shape),
                    "max": lambda: rng.choice([-128, -127, 127], size=shape),
                    "min": lambda: np.full(shape, -128), "zero": lambda: np.zeros(shape, dtype=np.int64)}[kind]()

        W = fill(w, (D, d)) * (rng.random((D, d)) < density)
        if per_column:
            W = np.zeros((D, d), dtype=np.int64)
            for i in range(d):
                W[rng.choice(D, size=per_column, replace=False), i] = rng.choice([-128, 127], size=per_column)
        W[np.arange(D), rng.integers(0, d, size=D)] = 127  # no row all zero
        table, shift = kernel_table(gamma=0.05, b_scale=1.0, size=table_size)
        stage = InputStage.from_standardisation(np.zeros(d), np.ones(d), 1 / 32)
        model = IntProtoNN(list(range(L)), stage, W.astype(np.int8), fill(b, (m, D)).astype(np.int8),
                           fill(z, (m, L)).astype(np.int8), proj_shift=proj_shift, table=table, table_shift=shift,
                           scales={})
        if b == "zero":
            return model
        dist = ((model.projections(extreme_vectors(d, rng))[:, None, :] - model.B_q.astype(np.int64)[None]) ** 2)
        gamma = float(np.sqrt(np.log(2) / max(float(np.median(dist.sum(axis=2))), 1.0)))
        table, shift = kernel_table(gamma=gamma, b_scale=1.0, size=table_size)
        return replace(model, table=table, table_shift=shift)

    return build


def _flynn(d, m, s, rho, *, bits, store_M=False):
    def build(rng):
        from tinyproto.families.flynn.quantize import IntFlyNN
        from tinyproto.families.flynn.train import FlyNNClassifier

        X = rng.normal(size=(120, d))
        y = (X[:, :5].sum(axis=1) > 0).astype(int) + (X[:, 5] > 1).astype(int)
        clf = FlyNNClassifier(m, s, rho, 0.5, sign_split=True, random_state=2).fit(X, y)
        return IntFlyNN.from_classifier(clf, X, y, bits=bits, store_M=store_M)

    return build


def _bnc(d, r, m, L, *, density=1.0, per_row=0):
    def build(rng):
        from tinyproto.families.bnc.pattern import pattern_mask
        from tinyproto.families.bnc.quantize import IntBNC
        from tinyproto.families.bnc.train import allocate_prototypes

        W = rng.choice([-128, -127, 127], size=(r, d))  # every product at the int8 limit
        pattern_seed = 0
        if per_row:
            pattern_seed = int(rng.integers(1, 65536))
            W[~pattern_mask(pattern_seed, r, d, per_row)] = 0
        else:
            W[rng.random((r, d)) > density] = 0
            W[np.arange(r), rng.integers(0, d, size=r)] = 127
        stage = InputStage.from_standardisation(np.zeros(d), np.ones(d), 0.03)
        return IntBNC(classes=list(range(L)), input_stage=stage, W_q=W, B_bits=rng.integers(0, 2, size=(m, r)),
                      proto_counts=allocate_prototypes(np.full(L, 1000), m), pattern_seed=pattern_seed,
                      per_row=per_row)

    return build


def _bloom(d, k, m, classes, *, bias):
    def build(rng):
        from tinyproto.families.bloom.quantize import IntBloom
        from tinyproto.families.bloom.slots import seeded_slots, used_slots

        seed = int(rng.integers(1, 65536))
        rows = 1 if classes == 2 else classes
        used = used_slots(seeded_slots(seed, d, k, m)).size
        weights = rng.choice([-128, -127, 127], size=(rows, used))  # every product at the int8 limit
        return IntBloom(list(range(classes)), InputStage.from_standardisation(np.zeros(d), np.ones(d), 1.0), seed,
                        m, k, weights, rng.integers(-bias, bias + 1, size=rows), 1.0)

    return build


# Every registered family has cases (test_every_family_has_cases); each list covers the twins' shapes and shapes
# the twins decline (the reference then runs on the AVR too), wide inputs and the accumulators' limits.
CASES = {
    "protonn": [
        ("dense-saturating", _protonn(64, 6, 20, 10, w="max", b="min", proj_shift=9)),
        ("bitmap-wide-24bit", _protonn(300, 8, 12, 3, w="max", density=0.5, proj_shift=15)),
        ("scores-at-2^23", _protonn(8, 4, 256, 4, w="max", b="zero", z="min", proj_shift=20)),
        ("nibble-codes-column-major", _protonn(96, 5, 10, 3, per_column=1, proj_shift=6)),
        ("byte-codes-column-major", _protonn(64, 16, 10, 4, per_column=1, proj_shift=6)),
        ("twins-decline-300-protos", _protonn(16, 6, 300, 3, proj_shift=8)),
    ],
    "flynn": [
        ("seeded-narrow-2bit", _flynn(64, 96, 7, 12, bits=2)),
        ("stored-M-1bit", _flynn(20, 64, 5, 8, bits=1, store_M=True)),
        ("seeded-wide-3bit", _flynn(200, 64, 6, 10, bits=3)),
    ],
    "bnc": [
        ("sparse-bitmap", _bnc(64, 24, 40, 10, density=0.3)),
        ("dense-odd-bits", _bnc(30, 13, 9, 3)),
        ("seeded-wide", _bnc(300, 16, 20, 4, per_row=12)),
    ],
    "bloom": [
        ("two-classes-used-below-256", _bloom(40, 3, 120, 2, bias=30000)),
        ("used-above-256-int32-bias", _bloom(200, 3, 600, 5, bias=2_000_000)),
    ],
}
CASE_IDS = [(family, name) for family in CASES for name, _ in CASES[family]]


def case_model(family: str, name: str):
    build = dict(CASES[family])[name]
    rng = np.random.default_rng(sum(map(ord, family + name)))
    model = build(rng)
    assert model.family == family
    return model, extreme_vectors(model.n_features, rng)


def test_every_family_has_cases():
    """A family added to the registry needs its cases here: its kernels are checked like every other's."""
    assert tuple(CASES) == families.names()


# ---- the three builds ------------------------------------------------------------------------------------------

def write_avr_project(model, project: Path, *flags: str) -> Path:
    """The model's validation firmware project (the current runtime sources) with extra -D flags; its ELF."""
    from bench_latency import write_project
    from tinyproto.core.boards import load_board
    from tinyproto.device.build import build_project

    if project.exists():
        shutil.rmtree(project)
    write_project(model, project, False, load_board("uno"))
    ini = project / "platformio.ini"
    text = ini.read_text()
    # TP_NO_RAW_INPUT: int8 vectors only, so a wide model's frame buffer stays small (the kernels are under test)
    extra = " ".join(("-DTP_NO_RAW_INPUT=1", *flags))
    ini.write_text(text.replace("-DTP_SIMULATED=1", f"-DTP_SIMULATED=1 {extra}"))
    assert extra in ini.read_text()
    return build_project(project, "uno_sim").elf


def run_on_simulated_uno(elf: Path, xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from tinyproto.device.protocol import open_device
    from tinyproto.device.sim import SimulatedUno

    with SimulatedUno(elf, markers=False) as uno, open_device(uno.port) as client:
        predictions = [client.predict(x) for x in xq]
    return (np.array([p.label for p in predictions]), np.array([p.scores for p in predictions], dtype=np.int64))


def assert_same_as_reference(model, xq, labels, scores, build: str) -> None:
    reference = np.asarray(model.scores(xq), dtype=np.int64)
    np.testing.assert_array_equal(scores, reference, err_msg=f"{build}: scores differ from IntModel.scores")
    np.testing.assert_array_equal(labels, model.labels(reference), err_msg=f"{build}: labels differ")


@needs("gcc")
@pytest.mark.parametrize("family,name", CASE_IDS, ids=[f"{f}-{n}" for f, n in CASE_IDS])
def test_reference_kernels_on_the_host(tmp_path, family, name):
    from tinyproto.core.render import write_sources
    from tinyproto.device.hostc import build_host_runner, run_int8

    model, xq = case_model(family, name)
    write_sources(model, tmp_path / "project", "test", 0, 1 << 20)
    labels, scores = run_int8(build_host_runner(tmp_path / "project", tmp_path / "runner", family), xq)
    assert_same_as_reference(model, xq, labels, scores, "host reference")


@pytest.mark.device
@pytest.mark.slow
@needs("avr-gcc")
@pytest.mark.skipif(not HAVE_SIM, reason="libsimavr-dev not installed")
@pytest.mark.parametrize("family,name", CASE_IDS, ids=[f"{f}-{n}" for f, n in CASE_IDS])
def test_avr_twins_and_avr_reference_on_the_simulated_uno(tmp_path, family, name):
    model, xq = case_model(family, name)
    for build, flags in (("AVR twins", ()), ("AVR reference (-DTP_FORCE_REFERENCE)", ("-DTP_FORCE_REFERENCE",))):
        elf = write_avr_project(model, tmp_path / build.split()[1], *flags)
        labels, scores = run_on_simulated_uno(elf, xq)
        assert_same_as_reference(model, xq, labels, scores, build)


# ---- the choice is made in one place, and the reference is plain C ---------------------------------------------

def _preprocess(source: Path, include: Path, *flags: str) -> str:
    result = subprocess.run(["avr-gcc", "-mmcu=atmega328p", "-E", "-dM", *flags, f"-I{include}", f"-I{FIRMWARE}",
                             str(source)], capture_output=True, text=True, check=True)
    return result.stdout


@needs("avr-gcc")
@pytest.mark.parametrize("family", families.names())
def test_force_reference_leaves_no_avr_twin_in_the_build(tmp_path, family):
    """With -DTP_FORCE_REFERENCE the AVR build includes no twin (no TP_<FAMILY>_AVR_* flag is defined); by default
    it does. The flags come only from tp_<family>_avr.h, which only tinyproto.h's TP_KERNELS_AVR lets in."""
    from tinyproto.core.render import write_sources

    model, _ = case_model(family, CASES[family][0][0])
    write_sources(model, tmp_path, "test", 0, 1 << 20)
    source = FIRMWARE / f"tp_{family}.c"
    twins = [line for line in _preprocess(source, tmp_path / "include").splitlines() if "_AVR_" in line
             and line.split()[1].startswith(f"TP_{family.upper()}_AVR_")]
    forced = _preprocess(source, tmp_path / "include", "-DTP_FORCE_REFERENCE")
    assert twins, f"the default AVR build of {family} uses no twin"
    assert "#define TP_KERNELS_AVR 0" in forced
    assert not [line for line in forced.splitlines() if line.split()[1].startswith(f"TP_{family.upper()}_AVR_")]


def test_the_kernel_choice_is_made_once_and_the_reference_has_no_assembly():
    """Only tinyproto.h tests __AVR__ to choose kernels (TP_KERNELS_AVR); the reference files hold no inline
    assembly and no AVR-only type; no family file repeats tinyproto.h's prototypes or names an old opt-out flag."""
    import re

    header = (FIRMWARE / "tinyproto.h").read_text()
    assert "#if defined(__AVR__) && !defined(TP_FORCE_REFERENCE)\n#define TP_KERNELS_AVR 1" in header
    for family in families.names():
        reference = (FIRMWARE / f"tp_{family}.c").read_text()
        twin = (FIRMWARE / f"tp_{family}_avr.h").read_text()
        code = re.sub(r"/\*.*?\*/", "", reference, flags=re.S)
        for forbidden in ("__AVR__", "asm", "__int24", "__uint24", "pgm_read", "NO_ASM"):
            assert forbidden not in code, f"tp_{family}.c uses {forbidden}"
        assert f'#if TP_KERNELS_AVR\n#include "tp_{family}_avr.h"\n#endif' in reference
        assert "__AVR__" not in twin  # the twin is chosen by tinyproto.h, never by itself
        for prototype in ("void tp_stream_begin(void);", "uint8_t tp_predict(const int8_t *x, int32_t *scores);"):
            assert prototype not in code, f"tp_{family}.c repeats tinyproto.h's {prototype}"
