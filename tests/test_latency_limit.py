"""--max-latency: the solvers keep only models whose predicted cycles (the family's cost model, on the int8
model that ships) fit the limit at the board's clock, refuse in one line naming the fastest affordable shape when
nothing fits, and prefer fewer predicted cycles among candidates tied on int8 accuracy."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tinyproto.families import predict_cycles
from tinyproto.families import int_model_from_json
from tinyproto.families.solving import SolveOptions

from helpers import needs, tinyproto


def cli(*args):
    return tinyproto(*args, timeout=600)


def _predicted_ms(model_dir) -> float:
    model = int_model_from_json(json.loads((model_dir / "model.json").read_text())["int_model"])
    return 1000.0 * predict_cycles(model)["total"] / 16_000_000


@pytest.fixture(scope="module")
def digits_1ms(tmp_path_factory):
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    out = tmp_path_factory.mktemp("lat") / "digits-1ms"
    compile_model("digits", CompileOptions("protonn", "2kB", 0, "uno", out, max_latency_ms=1.0))
    return out


def test_protonn_digits_2kB_within_1ms(digits_1ms):
    report = json.loads((digits_1ms / "report.json").read_text())
    assert report["max_latency_ms"] == 1.0
    # the shipped model, rebuilt from model.json, is predicted within the limit: exact w.r.t. the cost model
    assert _predicted_ms(digits_1ms) <= 1.0 / 1.03  # the cost model's 3 % headroom
    assert report["predicted_latency_ms"] == pytest.approx(_predicted_ms(digits_1ms))
    assert report["model_bytes"] <= 2048
    assert report["int8_accuracy"] >= 0.965  # the latency issue's goal
    runners = report["runners_up"]
    assert 1 <= len(runners) <= 5
    for entry in runners + [report["solver"]["chosen_validation"]]:
        assert {"val_int8_accuracy", "model_bytes", "predicted_latency_ms", "n_components"} <= set(entry)
        assert entry["predicted_latency_ms"] <= 1.0 and entry["model_bytes"] <= 2048
    for entry in report["solver"]["candidates"]:  # every validated candidate fitted too
        assert entry["predicted_cycles"] <= 16_000 / 1.03


def test_same_seed_same_bytes_with_a_limit(tmp_path):
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    for name in ("a", "b"):
        compile_model("wine", CompileOptions("protonn", "1kB", 3, "uno", tmp_path / name, max_latency_ms=0.4))
    for file in ("model.json", "model.h", "test_vectors.npz"):
        if (tmp_path / "a" / file).exists():
            assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file


@pytest.mark.parametrize("limit", [0.25, 0.4, 0.7])
def test_protonn_limit_holds_on_every_candidate(limit):
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.families.protonn.solver import fit_protonn_under_budget, model_cycles

    # 120 of the 426 training rows: the solver tries the same (d_hat, m) shapes as on all of them (11, 11 and 12
    # candidates; their sparsity, so their cycles, move by a few percent), in 8.0 s of CPU for the three limits
    # instead of 13.3
    sp = split(load_dataset("breast_cancer"))
    _, model, info = fit_protonn_under_budget(sp.X_train[:120], sp.y_train[:120], SolveOptions(1024, 0, limit))
    assert model_cycles(model) <= limit * 16_000
    assert all(t["predicted_cycles"] <= limit * 16_000 for t in info["candidates"])
    assert info["max_latency_ms"] == limit


def test_protonn_limit_scales_with_the_clock():
    """The limit is in ms at the board's clock: the same cycles take twice as long at 8 MHz."""
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.families.protonn.solver import fit_protonn_under_budget, model_cycles

    sp = split(load_dataset("wine"))
    _, model, _ = fit_protonn_under_budget(sp.X_train, sp.y_train, SolveOptions(1024, 0, 0.8, 8_000_000))
    assert model_cycles(model) <= 0.8e-3 * 8_000_000


def test_rank_prefers_fewer_cycles_then_bytes_among_ties():
    from tinyproto.families.protonn.solver import rank_candidates

    tried = [
        {"val_int8_accuracy": 0.95, "predicted_cycles": 30_000, "model_bytes": 2000},
        {"val_int8_accuracy": 0.95, "predicted_cycles": 20_000, "model_bytes": 1500},
        {"val_int8_accuracy": 0.95, "predicted_cycles": 20_000, "model_bytes": 1200},
        {"val_int8_accuracy": 0.94, "predicted_cycles": 5_000, "model_bytes": 500},
        {"val_int8_accuracy": 0.96, "predicted_cycles": 40_000, "model_bytes": 2048},
    ]
    assert rank_candidates(tried, 0.0) == [4, 2, 1, 0, 3]
    assert rank_candidates(tried, 0.011)[:3] == [2, 1, 0]  # a margin of 1.1 points admits the 0.95 ones
    assert rank_candidates(tried, 0.03)[0] == 3


def test_flynn_exact_cycles_mirror_the_cost_model():
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.families.flynn.quantize import IntFlyNN
    from tinyproto.families.flynn.solver import ExactCycles
    from tinyproto.families.flynn.train import FlyNNClassifier

    sp = split(load_dataset("wine"))
    for m, s, rho, bits, store, split_sign in [(300, 4, 16, 1, False, True), (120, 6, 8, 3, True, False),
                                               (512, 2, 32, 2, False, False)]:
        clf = FlyNNClassifier(n_hashes=m, n_inputs_per_hash=s, n_winners=rho, sign_split=split_sign,
                              random_state=1).fit(sp.X_train, sp.y_train)
        model = IntFlyNN.from_classifier(clf, sp.X_train, sp.y_train, bits=bits, store_M=store)
        exact = ExactCycles(model.seed, s, model.n_hash_inputs, m, model.n_features)
        assert exact.cycles(m, rho, bits, model.n_classes, store) == predict_cycles(model)["total"]


@pytest.mark.parametrize("limit", [2.0, 6.0])
def test_flynn_limit_holds(limit):
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.families.flynn.solver import fit_flynn_under_budget

    sp = split(load_dataset("digits"))
    _, model, info = fit_flynn_under_budget(sp.X_train, sp.y_train, SolveOptions(2048, 0, limit))
    assert predict_cycles(model)["total"] <= limit * 16_000
    assert info["estimated_cycles"] == predict_cycles(model)["total"]
    assert len(info["runners_up"]) == 5
    assert all(r["predicted_latency_ms"] <= limit for r in info["runners_up"])


@pytest.mark.parametrize("family,fastest", [("protonn", "d_hat=3 m=10"), ("flynn", "m=16 s=1 rho=8")])
def test_refusal_names_the_fastest_affordable_shape(tmp_path, family, fastest):
    result = cli("compile", "digits", "--model", family, "--budget", "2kB", "--max-latency", "0.05",
                 "--out", str(tmp_path / "x"))
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: no ") and "0.05 ms" in line and fastest in line
    assert " ms with " in line and "% " in line and "accuracy" in line
    assert "Traceback" not in result.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize("value,code", [("0", 2), ("-1", 2), ("nan", 1), ("fast", 2)])
def test_bad_limit_is_one_line(tmp_path, value, code):
    result = cli("compile", "wine", "--max-latency", value, "--out", str(tmp_path / "x"))
    assert result.returncode == code
    assert "Traceback" not in result.stderr and "--max-latency" in result.stderr


def test_no_limit_is_recorded_as_none(compiled):
    report = json.loads((compiled("breast_cancer", "1kB") / "report.json").read_text())
    assert report["max_latency_ms"] is None
    assert report["runners_up"] and report["predicted_latency_ms"] > 0


@needs("avr-gcc")
@pytest.mark.skipif(not os.path.exists("/usr/include/simavr/sim_avr.h"), reason="libsimavr-dev not installed")
def test_simulator_measures_the_limit(tmp_path):
    """The limit is a prediction; on the simulated Uno the measured cycles agree within the cost model's error."""
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    limit = 0.45
    out = tmp_path / "bc"
    compile_model("breast_cancer", CompileOptions("protonn", "1kB", 0, "uno", out, max_latency_ms=limit))
    assert _predicted_ms(out) <= limit
    assert cli("build", str(out)).returncode == 0
    result = cli("validate", str(out), "--sim", "--json")
    assert result.returncode == 0, result.stderr
    v = json.loads(result.stdout)
    assert v["score_agreement"] == 1.0
    # The limit binds the prediction; the simulator measures it within the cost model's error. Measured on this
    # model (d_hat=20 > 16, so z is read from SRAM, and only m=8 prototypes): the cost model under-predicts by
    # 5.4 %, more than its ~1 % on the calibrated shapes (digits 2 kB at 1 ms: -0.4 %). 6 % allowed here (the
    # confidence stage, tp_judge, is in the prediction: core/cost.judge_cycles).
    assert abs(v["predicted_error"]) < 0.06
    assert v["cycles_max"] <= limit * 16_000 * 1.06
    # validate holds the device to the limit the model was compiled with: the measured mean, as a check
    assert v["checks"]["latency_limit"]["ok"] is True and v["latency_ms_mean"] <= limit
    assert np.isclose(v["predicted_cycles"], _predicted_ms(out) * 16_000)


def test_latency_check_fails_a_model_over_its_limit():
    """The latency_limit check decides validate's verdict: over the limit, or a damaged limit, is a failure."""
    from tinyproto.pipeline.validate import latency_limit_check

    cycles = np.array([15_900, 16_100, 16_050])
    assert latency_limit_check({"max_latency_ms": None}, cycles, 16_000_000) is None
    assert latency_limit_check({}, cycles, 16_000_000) is None
    over = latency_limit_check({"max_latency_ms": 1.0}, cycles, 16_000_000)
    assert over["ok"] is False and "over --max-latency 1 ms" in over["detail"] and "1.006 ms" in over["detail"]
    assert latency_limit_check({"max_latency_ms": 1.01}, cycles, 16_000_000)["ok"] is True
    for damaged in ("1", True, -1.0, float("inf"), [1]):
        assert latency_limit_check({"max_latency_ms": damaged}, cycles, 16_000_000)["ok"] is False
    assert latency_limit_check({"max_latency_ms": 1.0}, np.array([]), 16_000_000)["ok"] is False


def test_solvers_keep_the_cost_models_headroom():
    """A limit is a promise about the device: the solvers accept predictions up to limit / (1 + tolerance)."""
    from tinyproto.core.cost import COST_MODEL_TOLERANCE, latency_cycle_limit

    assert COST_MODEL_TOLERANCE == 0.03
    assert abs(latency_cycle_limit(1.0, 16_000_000) - 16_000 / 1.03) < 1e-9
    assert latency_cycle_limit(1.0, 16_000_000, headroom=False) == 16_000
    assert latency_cycle_limit(None, 16_000_000) is None
