"""Wide inputs: the digits16/digits28 data sets, wide files, W's exact encodings, the priced input stages and
the streamed projection; the C code equals the numpy reference on the host (tp_predict, the raw-float path and
streamed chunks) and, for one wide model, on the simulated Uno."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from tinyproto.core.datasets import load_dataset
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.inputstage import InputStage, shared_stage, stage_bytes
from tinyproto.families.protonn import encoding
from tinyproto.families.protonn.quantize import IntProtoNN
from tinyproto.families.solving import SolveOptions

from helpers import needs, one_per_column, synthetic, tinyproto

FIXTURES = Path(__file__).resolve().parent / "fixtures"


# ---------------------------------------------------------------------------------------------- data sets


@pytest.mark.parametrize("name,side", [("digits16", 16), ("digits28", 28)])
def test_wide_digits(name, side):
    data = load_dataset(name)
    assert data.X.shape == (1797, side * side)
    assert data.X.min() == 0 and data.X.max() == 255
    assert np.array_equal(data.X, np.rint(data.X))  # whole grey levels, as USPS/MNIST pixels
    assert np.array_equal(data.y, load_dataset("digits").y)


def test_wide_csv_and_npz_load(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(40, 4100))
    y = np.arange(40) % 4
    path = tmp_path / "wide.csv"
    path.write_text(",".join(f"p{i}" for i in range(4100)) + ",label\n"
                    + "".join(",".join(map(str, row)) + f",{c}\n" for row, c in zip(X, y)))
    data = load_dataset(str(path))
    assert data.X.shape == (40, 4100) and np.array_equal(data.X, X)
    np.savez(tmp_path / "wide.npz", X=X.astype(np.float32), y=y)
    assert load_dataset(str(tmp_path / "wide.npz")).X.shape == (40, 4100)


# ---------------------------------------------------------------------------------------------- encodings




@pytest.mark.parametrize("D,d,density", [(4, 12, 1.0), (12, 40, 0.3), (12, 300, None), (6, 300, None),
                                         (1, 1, 1.0), (128, 3, 1.0), (8, 700, None)])
def test_encodings_round_trip_exactly(D, d, density):
    rng = np.random.default_rng(D * 1000 + d)
    if density is None:
        W = one_per_column(D, d, d // 5, rng)
    else:
        W = (rng.integers(-128, 128, size=(D, d)) * (rng.random((D, d)) < density)).astype(np.int8)
    for name in encoding.feasible(W):
        arrays = encoding.encode(W, name)
        assert sum(a.nbytes for a in arrays.values()) == encoding.encoded_bytes(W, name)
        np.testing.assert_array_equal(encoding.decode(arrays, name, W.shape), W)
    best = encoding.smallest(W)
    assert encoding.encoded_bytes(W, best) == min(encoding.encoded_bytes(W, n) for n in encoding.feasible(W))


def test_column_codes_need_every_column_and_scale_with_nonzeros():
    W = np.zeros((10, 784), dtype=np.int8)
    W[np.arange(784) % 10, np.arange(784)] = 3
    assert encoding.smallest(W) == "col_bytes"
    assert encoding.encoded_bytes(W, "col_bytes") == 2 * 784 < encoding.encoded_bytes(W, "bitmap")
    W[:, 5] = 0  # a column no weight reads: only the row-major encodings can say so
    assert "col_bytes" not in encoding.feasible(W)


# ---------------------------------------------------------------------------------------------- input stages


def test_shared_stage_prices_four_bytes_and_keeps_columns():
    rng = np.random.default_rng(1)
    X = rng.integers(0, 256, size=(50, 30)).astype(np.float64)
    stage = shared_stage(X)
    assert sum(a.nbytes for a in stage.carrays()) == stage_bytes("shared", 30) == 4
    assert stage_bytes("feature", 30) == 120
    xq = stage.quantize(X)
    assert xq.min() >= -127 and xq.max() <= 127 and abs(int(xq.min()) + int(xq.max())) <= 2
    used = np.zeros(30, dtype=bool)
    used[[2, 7, 29]] = True
    kept = stage.keep_only(used)
    assert kept.kept == (2, 7, 29) and kept.n_features == 3 and kept.n_raw == 30
    np.testing.assert_array_equal(kept.quantize(X), xq[:, used])  # raw rows of either width
    np.testing.assert_array_equal(kept.quantize(X[:, used]), xq[:, used])
    back = InputStage.from_json(kept.to_json())
    assert (back.kind, back.kept, back.n_raw) == ("shared", (2, 7, 29), 30)
    np.testing.assert_array_equal(back.quantize(X), xq[:, used])
    with pytest.raises(TinyprotoError, match="takes 30 features"):
        kept.quantize(X[:, :5])


# ---------------------------------------------------------------------------------------------- host C == numpy




def host_runners(model, tmp: Path) -> tuple[Path, Path]:
    from tinyproto.core.render import write_sources
    from tinyproto.device.hostc import HOST_CFLAGS, build_host_runner

    write_sources(model, tmp, "test", 0, 1 << 20)
    lib = tmp / "lib" / "tinyproto"
    stream = tmp / "stream_runner"
    subprocess.run(["gcc", *HOST_CFLAGS, f"-I{tmp / 'include'}", f"-I{lib}", str(FIXTURES / "stream_runner.c"),
                    str(lib / "tp_input.c"), str(lib / "tp_protonn.c"), "-lm", "-o", str(stream)], check=True)
    return build_host_runner(tmp, tmp / "runner", "protonn"), stream


def _parse(out: str) -> tuple[np.ndarray, np.ndarray]:
    rows = np.array([line.split() for line in out.splitlines()], dtype=np.int64)
    return rows[:, 0], rows[:, 1:]


# (D, d, density, stage, n_raw): one case per W encoding, both stages, kept columns of a wider raw input
HOST_CASES = [
    (4, 12, 1.0, "feature", None, "dense"),
    (12, 40, 0.3, "shared", None, "bitmap"),
    (12, 300, None, "shared", 784, "col_bytes"),
    (6, 300, None, "feature", 400, "col_nibbles"),
    (8, 600, None, "shared", 784, "col_nibbles"),
]


@needs("gcc")
@pytest.mark.parametrize("D,d,density,stage,n_raw,expected", HOST_CASES, ids=[c[5] + "-" + c[3] for c in HOST_CASES])
def test_host_c_equals_numpy(tmp_path, D, d, density, stage, n_raw, expected):
    from tinyproto.device.hostc import run_int8, run_raw

    rng = np.random.default_rng(D * 7 + d)
    model, X = synthetic(D, d, 20, 3, rng, stage=stage, density=density, n_raw=n_raw)
    assert model.w_encoding == expected
    assert (model.offset is not None) == (stage == "shared")
    xq = model.input_stage.quantize(X)
    reference = model.scores(xq)
    assert np.count_nonzero(model.kernels(xq)) > len(xq)  # the kernels carry the projections' bits
    runner, stream = host_runners(model, tmp_path)
    labels, scores = run_int8(runner, xq)
    np.testing.assert_array_equal(scores, reference)
    np.testing.assert_array_equal(labels, model.labels(reference))
    # the raw-float path: the C input stage on the kept columns equals the host's, bit for bit
    xq_c, labels_raw, _ = run_raw(runner, model.input_stage.select(X))
    np.testing.assert_array_equal(xq_c, xq)
    for chunk in (1, 7, 255):
        out = subprocess.run([str(stream), str(chunk)], input=xq.tobytes(), capture_output=True, check=True).stdout
        np.testing.assert_array_equal(_parse(out.decode())[1], reference)
    raw = np.ascontiguousarray(model.input_stage.select(X), dtype="<f4").tobytes()
    out = subprocess.run([str(stream), "16", "raw"], input=raw, capture_output=True, check=True).stdout
    np.testing.assert_array_equal(_parse(out.decode())[1], reference)


# ---------------------------------------------------------------------------------------------- simulated Uno


@needs("avr-gcc")
@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("D,d,m,L,density,encoding", [(12, 600, 20, 4, None, "col_bytes"),
                                                       (12, 188, 60, 10, 0.12, "bitmap")])
def test_wide_model_bit_exact_on_the_simulated_uno(tmp_path, D, d, m, L, density, encoding):
    """784-input models with a shared stage and offset: 600 features read through column codes (streamed), and
    188 through a bitmap (gathered, the assembly row kernel beside the offset rescale: once broke avr-gcc's frame
    pointer, which only the cycle count showed). Scores equal the numpy reference, cycles the cost model's
    within 3 %."""
    import os

    if not os.path.exists("/usr/include/simavr/sim_avr.h"):
        pytest.skip("libsimavr-dev not installed")
    from tinyproto.core.boards import load_board
    from tinyproto.core.render import write_sources
    from tinyproto.device.build import build_project, render_platformio_ini
    from tinyproto.device.protocol import open_device
    from tinyproto.device.sim import SimulatedUno
    from tinyproto.families import predict_cycles

    rng = np.random.default_rng(28)
    model, X = synthetic(D, d, m, L, rng, stage="shared", n_raw=784, density=density)
    assert model.w_encoding == encoding and model.n_features == d
    xq = model.input_stage.quantize(X)
    write_sources(model, tmp_path, "test", 0, 1 << 20)
    ini = render_platformio_ini(load_board("uno")).replace("-DTP_SIMULATED=1", "-DTP_SIMULATED=1 -DTP_NO_RAW_INPUT=1")
    (tmp_path / "platformio.ini").write_text(ini)
    build = build_project(tmp_path, "uno_sim")
    with SimulatedUno(build.elf) as uno, open_device(uno.port) as client:
        predictions = [client.predict(x) for x in xq]
    np.testing.assert_array_equal(np.array([p.scores for p in predictions]), model.scores(xq))
    cycles = float(np.mean([p.cycles for p in predictions]))
    assert abs(predict_cycles(model)["total"] - cycles) / cycles < 0.03


# ---------------------------------------------------------------------------------------------- quantize, solver


@pytest.fixture(scope="module")
def d16():
    from tinyproto.core.datasets import split

    sp = split(load_dataset("digits16"))
    return sp.X_train[:400], sp.y_train[:400], sp.X_test[:200], sp.y_test[:200]


@pytest.mark.parametrize("scaling,stage", [("global", "shared"), ("feature", "feature")])
def test_quantize_keeps_only_read_features(d16, scaling, stage):
    from tinyproto.families.protonn.quantize import quantize_protonn
    from tinyproto.families.protonn.train import ProtoNNClassifier

    X, y, X_test, y_test = d16
    clf = ProtoNNClassifier(n_components=8, n_prototypes=20, sparsity_W=0.03, n_epochs=8, random_state=0,
                            scaling=scaling).fit(X, y)
    model = quantize_protonn(clf, X, table_size=32, stage=stage)
    read = int(np.count_nonzero((np.abs(clf.W_) > 0).any(axis=0)))
    assert model.n_features <= read < 256 and model.input_stage.n_raw == 256
    assert (model.W_q != 0).any(axis=0).all()  # every kept column is read
    assert (model.offset is not None) == (stage == "shared")
    stage_bytes_ = sum(a.nbytes for a in model.input_stage.carrays())
    assert stage_bytes_ == (4 if stage == "shared" else 4 * model.n_features)
    full = model.predict(X_test)  # raw rows of the data's width ...
    kept = np.asarray(model.classes)[model.labels(model.scores(model.input_stage.quantize(
        X_test[:, list(model.input_stage.kept)])))]  # ... or of the kept columns: the same
    np.testing.assert_array_equal(full, kept)
    assert np.mean(full == y_test) > 0.7
    back = IntProtoNN.from_json(model.to_json())
    np.testing.assert_array_equal(back.scores(back.input_stage.quantize(X_test)),
                                  model.scores(model.input_stage.quantize(X_test)))


def test_wide_budget_refusal_is_one_clear_line(d16):
    from tinyproto.families.protonn.solver import fit_protonn_under_budget

    X, y, _, _ = d16
    with pytest.raises(TinyprotoError, match=r"budget 100 B is too small .* needs \d+ B"):
        fit_protonn_under_budget(X, y, SolveOptions(100, 0))


def test_a_family_that_does_not_stream_is_refused_on_too_wide_data_before_training(tmp_path):
    """FlyNN holds the whole int8 input in SRAM: 3,000 features cannot fit an Uno, which is said at once (naming
    how many would fit and the families that stream), not after the shape search."""
    import time

    rng = np.random.default_rng(0)
    data = tmp_path / "window.npz"
    np.savez(data, X=rng.normal(size=(40, 3000)).astype(np.float32), y=np.arange(40) % 2)
    started = time.monotonic()
    result = tinyproto("compile", str(data), "--model", "flynn",
                             "--out", str(tmp_path / "m"), timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "FlyNN keeps the whole int8 input in SRAM: 3000 features need" in result.stderr
    assert "features fit" in result.stderr and "protonn" in result.stderr
    assert not (tmp_path / "m").exists() and time.monotonic() - started < 60


def test_auto_skips_a_family_whose_model_the_board_cannot_run():
    from tinyproto import families
    from tinyproto.core.errors import TinyprotoError

    rng = np.random.default_rng(1)
    X = rng.normal(size=(80, 6)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int)

    def only_bloom(model):
        if model.family != "bloom":
            raise TinyprotoError(f"{model.family} does not fit this board")

    clf, model, info = families.fit_best_family(X, y, SolveOptions(1024, 0), fits_board=only_bloom)
    assert model.family == "bloom" and info["auto"]["chosen"] == "bloom"
    refused = {o["family"]: o.get("refused") for o in info["auto"]["families"]}
    assert refused["protonn"] == "protonn does not fit this board"
