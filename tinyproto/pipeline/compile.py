"""`tinyproto compile`: data -> model under a byte budget -> int8 model -> C + PlatformIO project + report.

Layer: pipeline."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tinyproto.core.version import __version__
from tinyproto.core import wire
from tinyproto import families
from tinyproto.core.boards import Board, load_board
from tinyproto.core.budget import parse_budget
from tinyproto.core.datasets import Dataset, Split, default_out_dir, load_dataset, split
from tinyproto.core.confidence import UNKNOWN_LABEL
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.labels import encode
from tinyproto.families import SolveOptions, buffer_room, default_jobs
from tinyproto.core.folds import Folds
from tinyproto.core.ledger import Ledger
from tinyproto.core.modeldir import MODEL_FORMAT, MODEL_FORMAT_VERSION, TestVectors, int_model_digest
from tinyproto.core.safe_io import file_sha256, write_json
from tinyproto.core.outdir import atomic_directory, check_model_output_dir
from tinyproto.core.render import check_prefix, default_prefix, model_hash, write_sources

INT8_LOSS_WARNING_POINTS = 0.5


@dataclass(frozen=True)
class CompileResult:
    out_dir: Path
    report: dict
    ledger: Ledger


@dataclass(frozen=True)
class Fitted:
    """A trained model as a producer hands it over: the float estimator, its integer model, the solver's info
    (info["chosen"]: the hyper-parameters) and the seconds training took."""

    clf: Any
    model: Any
    info: dict
    train_seconds: float = 0.0


@dataclass(frozen=True)
class TrainedOn:
    """What a model was trained on and for: the data set and its split, the seed, the byte budget, the board."""

    dataset: Dataset
    split: Split
    seed: int
    budget_bytes: int
    board: Board
    prefix: str | None = None  # the model's C prefix (None: from the data set's name)


def firmware_sram_estimate(model, board: Board) -> dict:
    """SRAM the deployed firmware will need, before building: the family's buffers + the device app's (frame
    buffer, int8 input buffer unless the family streams, its own state) + the board's reserve for call frames,
    then the receive ring in what they leave free (wire.rx_ring_bytes: up to 256 B, none when too little is left;
    `rx_ring_bytes` is the ring the project is rendered with).

    It bounds what the build (`avr-size`: .data + .bss) and the device (painted stack peak) then measure:
    tests/test_widths.py checks static + stack peak <= this estimate from 8 to 2,048 features.
    """
    from tinyproto.device.frames import app_sram

    streamable = bool(model.defines().get("TP_STREAMABLE", 0))
    # A family's "input" item is the int8 vector its tp_predict() reads: the app's input buffer, counted once.
    working = sum(item.nbytes for item in model.working_sram() if item.name != "input")
    without_ring = app_sram(model.n_features, model.n_classes, streamable, rx_ring=0)
    ring = wire.rx_ring_bytes(board.sram_bytes - (working + without_ring.total + board.sram_reserved_bytes))
    app = app_sram(model.n_features, model.n_classes, streamable, rx_ring=ring)
    total = working + app.total + board.sram_reserved_bytes
    return {"working_bytes": working, "serial_frame_bytes": app.frame, "input_buffer_bytes": app.input,
            "app_static_bytes": app.app, "rx_ring_bytes": ring, "reserved_bytes": board.sram_reserved_bytes,
            "estimated_total_bytes": total, "board_sram_bytes": board.sram_bytes, "streamable": streamable}


def rx_ring_of(model, board: Board) -> int:
    """The receive ring of this model's firmware on this board (0: none), as compile renders it."""
    return firmware_sram_estimate(model, board)["rx_ring_bytes"]


def sram_refusal(sram: dict, n_features: int, board: Board) -> str:
    """One line: what the firmware would need, the limit, and what would fit. A refused model has no receive
    ring (the ring only takes SRAM left free), so the parts named sum to the total."""
    over = sram["estimated_total_bytes"] - board.sram_bytes
    if sram["input_buffer_bytes"] > over:  # the app holds the d int8 features: fewer of them would fit
        fit = f"; at most {n_features - over} features would fit this model's other buffers"
    else:  # the family's own buffers are too large: say how many bytes they could have
        room = sram["working_bytes"] - over
        fit = (f"; the model's buffers would fit in {room} B (a smaller model, or a family whose buffers do not "
               "grow with the features)" if room > 0 else "; no model of this width would fit")
    return (f"the model's inference needs about {sram['estimated_total_bytes']} B of SRAM (buffers "
            f"{sram['working_bytes']} B + input {sram['input_buffer_bytes']} B + serial frame "
            f"{sram['serial_frame_bytes']} B + app {sram['app_static_bytes']} B + reserve "
            f"{sram['reserved_bytes']} B), "
            f"more than the {board.sram_bytes} B of {board.title}{fit}")


def check_fits_board(model, board: Board) -> None:
    """Refuse (one line) a model whose inference would not fit the board's SRAM."""
    sram = firmware_sram_estimate(model, board)
    if sram["estimated_total_bytes"] > board.sram_bytes:
        raise TinyprotoError(sram_refusal(sram, model.n_features, board))


def refuse_too_many_classes(n_classes: int, board: Board) -> None:
    """The device app answers every class's int32 score in one frame: its buffer must fit the board's limit
    (wire.frame_buffer_limit), or the build fails on tp_app.h's #error. Refused before training, for every family."""
    from tinyproto.core.wire import frame_buffer_bytes, frame_buffer_limit, most_classes

    need, limit = frame_buffer_bytes(n_classes), frame_buffer_limit(board.sram_bytes)
    if need > limit:
        raise TinyprotoError(
            f"{n_classes} classes need a serial frame buffer of {need} B on the device (4 B of score per class), more "
            f"than the {limit} B its app may take of {board.title}'s SRAM: at most {most_classes(board.sram_bytes)} "
            "classes fit; merge classes or choose a board with more SRAM (`tinyproto boards`)")


def refuse_too_wide(family_name: str, n_features: int, n_classes: int, board: Board) -> None:
    """A family that does not stream keeps the whole int8 input in SRAM: on more features than the board holds
    (beside the serial frame, the app and the reserve), no model of it fits, so it is refused before training."""
    fam = families.family(family_name)
    if fam.streamable:
        return
    room = buffer_room(board, n_features, n_classes, streamable=False)  # the ring only takes what is left free
    need = board.sram_bytes - room
    if room < 0:
        fit = max(0, n_features + room)
        streaming = ", ".join(name for name in families.names() if families.family(name).streamable)
        raise TinyprotoError(f"{fam.title} keeps the whole int8 input in SRAM: {n_features} features need at least "
                             f"{need} B, more than the {board.sram_bytes} B of {board.title}; at most {fit} features "
                             f"fit, fewer once the model's own buffers are counted (fewer columns), or choose a "
                             f"family that streams its input ({streaming})")


@dataclass(frozen=True)
class CompileOptions:
    """What `tinyproto compile` takes beside DATA, each with the command's default.

    family: a registered family (tinyproto.families) or "auto" (the best validated one within the budget).
    budget: the model's flash budget (`2kB`, `1.5kB`, `2048B` or a number of bytes).
    board: a board name (boards/); baud: the serial line's speed built into the project (default the board's).
    out: the model directory (default build/<data set name>); label: the CSV's label column (default the last).
    learnable (a family that learns on the device): also fit what the device holds while learning (`tinyproto
    learn`) beside the learning firmware's buffers, stack and reserve, and in the EEPROM record.
    max_latency_ms: only models whose predicted latency (the family's cost model at the board's clock) fits.
    jobs: worker processes for the solver (None: every usable core, 1 inside a dask worker); the model does not
    depend on it.
    unknown_rate ("5%", 0.05): the device declines (answers 255) inputs whose novelty exceeds a threshold fitted so
    that about that share of known-class rows would be declined; None: no threshold, nothing else changes.
    clip_check (with unknown_rate): also decline inputs with more than a few int8 values at the clip, when the
    training rows show where that count is rare (docs/guides/confidence.md, the clip check).
    holdout_classes ("8,9"): those classes' rows go to the test split only (the model never sees them); the report
    says how well the novelty score tells them apart (docs/guides/confidence.md).
    prefix: the model's C prefix (every external symbol: <prefix>_predict, ...; default from the data set's name).
    reserve_sram, reserve_flash: what the user's own sketch uses of the board (bytes or `1.2kB`): the model's code
    and data, measured by building them, must fit what is left (beside_sketch), or compile refuses it."""

    family: str = families.DEFAULT
    budget: str | int = "2kB"
    seed: int = 0
    board: str = "uno"
    out: Path | str | None = None
    label: str | None = None
    learnable: bool = False
    max_latency_ms: float | None = None
    baud: int | None = None
    jobs: int | None = None
    unknown_rate: str | float | None = None
    clip_check: bool = False
    holdout_classes: str | None = None
    prefix: str | None = None
    reserve_sram: str | int | None = None
    reserve_flash: str | int | None = None

    def __post_init__(self) -> None:
        """Each field's type, for a caller in Python (the CLI's parser gives these types): a baud of "fast", a
        max_latency_ms of "x" or a seed of -1 raised TypeError / ValueError from deep inside."""
        from tinyproto.core.option_lists import api_int, api_number, api_text, check_seed

        api_text(self.family, "family")
        if not isinstance(self.budget, (str, int)) or isinstance(self.budget, bool):
            raise TinyprotoError(f"budget must be a size such as '2kB' or a number of bytes, not "
                                 f"{type(self.budget).__name__} {str(self.budget)[:40]!r}")
        check_seed(self.seed, "seed")
        api_text(self.board, "board")
        for name in ("label", "holdout_classes", "prefix"):
            if getattr(self, name) is not None:
                api_text(getattr(self, name), name)
        if self.out is not None and not isinstance(self.out, (str, os.PathLike)):
            raise TinyprotoError(f"out must be a path (a str or a pathlib.Path), not {type(self.out).__name__}")
        if self.baud is not None:
            api_int(self.baud, "baud")
        if self.jobs is not None:
            api_int(self.jobs, "jobs")
        if self.max_latency_ms is not None:
            api_number(self.max_latency_ms, "max_latency_ms")
        for name in ("learnable", "clip_check"):
            if not isinstance(getattr(self, name), bool):
                raise TinyprotoError(f"{name} must be True or False, not {getattr(self, name)!r}")


def compile_model(data: str, options: CompileOptions | None = None,
                  progress: Callable[[str], None] | None = None) -> CompileResult:
    """Train DATA's model within the budget, quantize it and write its model directory, as `tinyproto compile`
    does (see CompileOptions for every option). progress: called with one line per step."""
    from tinyproto.core.confidence import check_rate, parse_rate

    if options is not None and not isinstance(options, CompileOptions):  # a dict: "no attribute 'budget'"
        raise TinyprotoError(f"options must be a CompileOptions (tinyproto.pipeline.compile.CompileOptions(budget="
                             f"'2kB', ...)), not {type(options).__name__}")
    o = options or CompileOptions()
    budget_bytes = parse_budget(o.budget)
    rate = None if o.unknown_rate is None else (  # a float given in Python, or text as the CLI's option
        check_rate(float(o.unknown_rate), o.unknown_rate, "the unknown rate") if isinstance(o.unknown_rate, float)
        else parse_rate(o.unknown_rate))
    if o.clip_check and rate is None:
        raise TinyprotoError("--clip-check is part of --unknown-rate: give both (e.g. --unknown-rate 5% --clip-check)")
    if o.prefix is not None:
        check_prefix(o.prefix)
    reserve = Reserve.parse(o.reserve_sram, o.reserve_flash)
    if o.max_latency_ms is not None and not (0 < o.max_latency_ms < math.inf):
        raise TinyprotoError(f"--max-latency must be a positive number of milliseconds, got {o.max_latency_ms}")
    board = load_board(o.board).with_baud(o.baud)
    from tinyproto.device.build import check_mcu_known

    check_mcu_known(board)
    reserve.check_room_on(board)
    if o.family != families.AUTO:
        families.family(o.family)  # an unknown name is refused before the data is read
    if o.learnable and (o.family == families.AUTO or not families.family(o.family).learnable):
        raise TinyprotoError(f"--learnable is for --model {' or '.join(families.learnable_names())}: only "
                             f"{', '.join(families.family(n).title for n in families.learnable_names())} learns on "
                             "the device")
    if o.out is not None:  # an unusable --out is refused now, before the data is read, not after minutes of training
        check_model_output_dir(Path(o.out))
    dataset = load_dataset(data, label=o.label)
    out_dir = Path(o.out) if o.out is not None else default_out_dir(dataset)
    if o.out is None:  # the default --out is named after the data set
        check_model_output_dir(out_dir)
    sp = split(dataset)
    if o.holdout_classes is not None:
        sp = hold_out(sp, o.holdout_classes)

    n_classes = len(np.unique(sp.y_train))
    refuse_too_many_classes(n_classes, board)
    if o.family != families.AUTO:
        refuse_too_wide(o.family, sp.X_train.shape[1], n_classes, board)
    started = time.perf_counter()
    solve = SolveOptions(budget_bytes, o.seed, o.max_latency_ms, board.f_cpu_hz,
                         n_jobs=default_jobs() if o.jobs is None else o.jobs, progress=progress,
                         folds=Folds.standard(sp.X_train, sp.y_train, o.seed),
                         learn_on=board if o.learnable else None, board=board, clip_check=o.clip_check)
    if o.family == families.AUTO:
        clf, model, info = families.fit_best_family(sp.X_train, sp.y_train, solve,
                                                    fits_board=lambda m: check_fits_board(m, board))
        model, info["confidence"] = families.calibrate_chosen(model.family, model, info["chosen"], sp.X_train,
                                                              sp.y_train, solve, rate)
    else:
        clf, model, info = families.fit_judged(o.family, sp.X_train, sp.y_train, solve, rate)
    info["max_latency_ms"] = o.max_latency_ms
    beside = beside_sketch(model, board, reserve, progress) if reserve.given else None
    train_seconds = time.perf_counter() - started
    return write_model_directory(Fitted(clf, model, info, train_seconds),
                                 TrainedOn(dataset, sp, o.seed, budget_bytes, board, o.prefix), out_dir, progress,
                                 extra_report={"beside_sketch": beside} if beside else None)


@dataclass(frozen=True)
class Reserve:
    """What the user's own sketch uses of the board (--reserve-sram, --reserve-flash), in bytes."""

    sram_bytes: int = 0
    flash_bytes: int = 0

    @classmethod
    def parse(cls, sram: str | int | None, flash: str | int | None) -> "Reserve":
        return cls(parse_budget(sram, "--reserve-sram") if sram is not None else 0,
                   parse_budget(flash, "--reserve-flash") if flash is not None else 0)

    @property
    def given(self) -> bool:
        return bool(self.sram_bytes or self.flash_bytes)

    def check_room_on(self, board: Board) -> None:
        """A reserve that takes the whole board leaves no room for any model: refused before training."""
        for option, reserved, whole, memory in (
                ("--reserve-flash", self.flash_bytes, board.flash_bytes_for_sketch, "flash for a sketch"),
                ("--reserve-sram", self.sram_bytes, board.sram_bytes, "SRAM")):
            if reserved >= whole:
                raise TinyprotoError(f"{option} {reserved} B leaves nothing for the model: the {board.title} has "
                                     f"{whole} B of {memory}")


def beside_sketch(model, board: Board, reserve: Reserve, progress: Callable[[str], None] | None = None) -> dict:
    """The model's code and data measured by building them (device/library_cost.py), checked against what the
    user's sketch leaves of the board; one TinyprotoError naming what does not fit and by how much."""
    from tinyproto.device.library_cost import measure_library

    if progress:
        progress("measuring the model's library (avr-gcc)")
    cost = measure_library(model, board)
    flash_left = board.flash_bytes_for_sketch - reserve.flash_bytes
    sram_left = board.sram_bytes - reserve.sram_bytes
    problems = []
    if cost.flash_bytes > flash_left:
        problems.append(f"flash: the model's runtime and data need {cost.flash_bytes} B, "
                        f"{cost.flash_bytes - flash_left} B "
                        f"more than the {flash_left} B that --reserve-flash {reserve.flash_bytes} leaves of "
                        f"{board.flash_bytes_for_sketch} B")
    if cost.sram_bytes > sram_left:
        problems.append(f"SRAM: the model needs {cost.sram_bytes} B (static {cost.static_sram_bytes} B + stack at "
                        f"most {cost.stack_bound_bytes} B + your raw, x and scores buffers {cost.caller_bytes} B), "
                        f"{cost.sram_bytes - sram_left} B more than the {sram_left} B that --reserve-sram "
                        f"{reserve.sram_bytes} leaves of {board.sram_bytes} B")
    if problems:
        raise TinyprotoError(f"the model does not fit beside your sketch on the {board.title}: " + "; ".join(problems)
                             + " (a smaller --budget, or less reserved)")
    return {"reserve_sram_bytes": reserve.sram_bytes, "reserve_flash_bytes": reserve.flash_bytes,
            "library": cost.to_dict(), "flash_left_bytes": flash_left - cost.flash_bytes,
            "sram_left_bytes": sram_left - cost.sram_bytes}


def hold_out(sp: Split, classes_text: str) -> Split:
    """The split with the named classes' training rows moved to the test split: the model never sees them."""
    from tinyproto.core.confidence import held_out_classes

    chosen = held_out_classes(classes_text, sp.y_train)
    held = np.isin(sp.y_train, np.asarray(chosen, dtype=sp.y_train.dtype))
    return Split(sp.X_train[~held], sp.y_train[~held], np.concatenate([sp.X_test, sp.X_train[held]]),
                 np.concatenate([sp.y_test, sp.y_train[held]]))


def write_model_directory(fitted: Fitted, on: TrainedOn, out_dir: Path, progress: Callable[[str], None] | None = None,
                          extra_report: dict | None = None, verb: str = "compile") -> CompileResult:
    """Check a fitted model against the budget and the board, then write its model directory atomically.

    Shared by `compile` and every other producer of models (federated training, benchmarks), so each
    directory has the same files, report keys and checks. `extra_report` adds a producer's own keys to
    report.json inside the same atomic write. `verb` is the command that made it (the manifest records it, so a
    reader's "make it again" advice names that command).
    """
    clf, model, info, train_seconds = fitted.clf, fitted.model, fitted.info, fitted.train_seconds
    dataset, sp, seed, budget_bytes, board = on.dataset, on.split, on.seed, on.budget_bytes, on.board
    ledger = Ledger(model.carrays(), model.working_sram())
    if ledger.model_bytes > budget_bytes:  # the solvers guarantee this; a breach is a bug, never shipped
        raise TinyprotoError(f"internal error: model is {ledger.model_bytes} B, over the {budget_bytes} B budget")
    check_fits_board(model, board)
    sram = firmware_sram_estimate(model, board)

    family = model.family
    vectors = _test_vectors(model, sp.X_test, sp.y_test)
    known = vectors.y != UNKNOWN_LABEL  # a held-out class's rows (--holdout-classes) are no class of the model
    float_pred = clf.predict(sp.X_test[known])
    int8_pred = np.asarray(model.classes)[vectors.labels[known]]
    report = _report(dataset, family, seed, budget_bytes, board, ledger, model, info, sram, train_seconds,
                     float_pred, int8_pred, sp.y_test[known])
    report["n_train"], report["n_test"] = int(len(sp.y_train)), int(len(sp.y_test))  # held-out rows included
    report["confidence"] = (confidence_report(vectors, model, info.get("confidence"))
                            if families.calibrated(model) else None)  # a model without a table says nothing
    report.update(extra_report or {})

    if progress:
        progress(f"writing {out_dir}")
    with atomic_directory(out_dir, verb) as scratch:
        write_model_files(scratch, model, _model_json(model, dataset, family, seed, budget_bytes, board, info,
                                                      on.prefix), report, vectors, board)
    return CompileResult(Path(out_dir), report, ledger)


def write_model_files(scratch: Path, model, meta: dict, report: dict, vectors: TestVectors, board: Board) -> None:
    """Every file of a model directory into `scratch` (the inside of an atomic_directory): the test vectors,
    model.json bound to them, the C sources, the PlatformIO project and its `pio test` suite, report.json.
    The one writer of model directories: compile, federate and learn's learned model all use it."""
    vectors.save(scratch / "test_vectors.npz")
    meta = dict(meta, vectors_sha256=file_sha256(scratch / "test_vectors.npz"))  # validate refuses other vectors
    write_json(scratch / "model.json", meta)
    write_sources(model, scratch, str(meta.get("dataset", "?")), int(meta.get("seed", 0)), int(meta["budget_bytes"]),
                  rx_ring=rx_ring_of(model, board), prefix=meta.get("prefix"))
    _write_project(model, scratch, board, vectors)
    write_json(scratch / "report.json", report)


def _test_vectors(model, X_test: np.ndarray, y_test: np.ndarray) -> TestVectors:
    xq = model.input_stage.quantize(X_test)
    scores = model.scores(xq)
    classes = list(model.classes)
    unseen = ~np.isin(np.asarray(y_test, dtype=object), np.asarray(classes, dtype=object))
    if unseen.all():
        raise TinyprotoError("the test split holds no row of a class the model knows")
    y_index = np.full(len(y_test), UNKNOWN_LABEL, dtype=np.int64)  # a held-out class: the right answer is unknown
    y_index[~unseen] = encode(np.asarray(y_test)[~unseen], classes, "the test split")
    labels = model.labels(scores).astype(np.int64)
    confidence, decided = families.judge(model, scores, labels, xq)
    # the kept columns only: a feature no weight reads is never sent (see InputStage)
    return TestVectors(model.input_stage.select(X_test).astype(np.float32), xq, y_index, scores.astype(np.int64),
                       labels, confidence.astype(np.int64), decided.astype(np.int64))


def confidence_report(vectors: TestVectors, model, calibration_info: dict | None) -> dict:
    """report.json's "confidence": coverage, accuracy on the accepted rows and calibration error on the known
    test rows; with held-out classes the novelty score's AUROC (held-out against known) and the share declined."""
    from tinyproto.core.confidence import auroc, judged_figures

    known = vectors.y != UNKNOWN_LABEL
    out = judged_figures(vectors.confidence, vectors.decided, vectors.labels, vectors.y, known)
    out["calibration"] = calibration_info
    if not known.all():
        novelty = families.novelty_score(model, vectors.scores, vectors.labels, vectors.xq)
        out["held_out"] = {"rows": int((~known).sum()),
                           "auroc": auroc(novelty[~known], novelty[known]),
                           "declined": float(np.mean(vectors.decided[~known] == UNKNOWN_LABEL))}
    return out


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def _write_project(model, project_dir: Path, board: Board, vectors: TestVectors) -> None:
    """platformio.ini and the `pio test` suite (a handful of vectors with their reference scores)."""
    from tinyproto.device.build import render_pio_test, render_platformio_ini

    (project_dir / "platformio.ini").write_text(render_platformio_ini(board), encoding="utf-8")
    n = min(8, len(vectors.labels))
    if n:
        render_pio_test(project_dir, vectors.xq[:n], vectors.scores[:n], vectors.labels[:n])


def _model_json(model, dataset: Dataset, family: str, seed: int, budget_bytes: int, board: Board, info: dict,
                prefix: str | None = None) -> dict:
    return {
        "format": MODEL_FORMAT,
        "format_version": MODEL_FORMAT_VERSION,
        "tinyproto_version": __version__,
        "family": family,
        "dataset": dataset.name,
        "prefix": prefix or default_prefix(dataset.name),
        "seed": seed,
        "board": board.name,
        "budget_bytes": budget_bytes,
        "model_hash": f"0x{model_hash(model):08X}",
        "hyperparameters": info["chosen"],
        "int_model": model.to_json(),
        "int_model_sha256": int_model_digest(model.to_json()),
    }


COLLAPSE_MIN_POINTS = 10.0  # a test accuracy this far (or 4 standard errors) below the validated one is not noise


def accuracy_collapse(info: dict, test_accuracy: float, y_test: np.ndarray) -> str | None:
    """A warning when the shipped model's test accuracy is far below the accuracy the solver validated for it
    (cross-validation on training data), or None. Noise cannot explain a gap of more than 4 standard errors of
    the test split (and at least COLLAPSE_MIN_POINTS): the model shipped is not behaving like the one validated
    (a refit that diverged, a label mix-up, a test split unlike the training rows), and it is named, never
    passed silently. Near the majority-class rate it says so: such a model predicts (almost) one class."""
    chosen = info.get("chosen_validation") or {}
    validated = chosen.get("val_int8_accuracy")
    n = len(y_test)
    if not isinstance(validated, (int, float)) or not n:
        return None
    noise = 4.0 * math.sqrt(max(validated * (1.0 - validated), 1.0 / n) / n)
    gap = validated - test_accuracy
    if gap <= max(noise, COLLAPSE_MIN_POINTS / 100.0):
        return None
    majority = float(np.unique(np.asarray(y_test), return_counts=True)[1].max()) / n
    near_chance = test_accuracy <= majority + 0.05
    return (f"test accuracy {100 * test_accuracy:.1f} % is {100 * gap:.1f} points below the validated "
            f"{100 * validated:.1f} %" + (f", no better than always answering the most frequent class "
                                          f"({100 * majority:.1f} %)" if near_chance else "")
            + ": the shipped model does not behave like the model validated; do not deploy it (try another --seed "
            "or --budget, and check the labels)")


def int8_loss_warning(float_pred, int8_pred, y_test) -> str | None:
    """The warning when quantization costs more than INT8_LOSS_WARNING_POINTS of test accuracy, with the count of
    rows behind it: on a small test split one row is more than a point."""
    y_test = np.asarray(y_test)
    right_float = int(np.sum(np.asarray(float_pred) == y_test))
    right_int8 = int(np.sum(np.asarray(int8_pred) == y_test))
    points = 100 * (right_float - right_int8) / len(y_test)
    if points <= INT8_LOSS_WARNING_POINTS:
        return None
    return (f"int8 accuracy is {points:.1f} points below float: {right_float - right_int8} more of the "
            f"{len(y_test)} test rows wrong after quantization (a larger --budget or another --model may keep them)")


def contradictory_rows_warning(X, y) -> str | None:
    """The warning when the same row occurs under more than one label: no model can tell those rows apart, and
    the test split may put one copy in training and its twin, labelled otherwise, in the test rows, so accuracy
    falls below what the rest of the data allows with nothing else to say why."""
    X = np.ascontiguousarray(np.asarray(X))
    y = np.asarray(y)
    if X.ndim < 2 or not len(y):
        return None
    rows = X.reshape(len(X), -1).view(np.dtype((np.void, X.dtype.itemsize * int(np.prod(X.shape[1:])))))[:, 0]
    _, row_ids = np.unique(rows, return_inverse=True)
    _, label_ids = np.unique(y, return_inverse=True)
    pairs = np.unique(np.stack([row_ids.ravel(), label_ids.ravel()], axis=1), axis=0)
    ids, labels_per_row = np.unique(pairs[:, 0], return_counts=True)
    shared = ids[labels_per_row > 1]
    if not shared.size:
        return None
    n_rows = int(np.isin(row_ids, shared).sum())
    classes = sorted({str(c) for c in y[np.isin(row_ids, shared)]})
    shown = ", ".join(classes[:4]) + (", ..." if len(classes) > 4 else "")
    return (f"{n_rows} rows of the data occur with more than one label (classes {shown}): no model can tell "
            "them apart, and the accuracy on them is chance; check the labels")


def _report(dataset, family, seed, budget_bytes, board, ledger, model, info, sram, train_seconds,
            float_pred, int8_pred, y_test) -> dict:
    from tinyproto.families import predict_cycles

    float_acc = float(np.mean(float_pred == y_test))
    int8_acc = float(np.mean(int8_pred == y_test))
    warnings = []
    loss = int8_loss_warning(float_pred, int8_pred, y_test)
    if loss:
        warnings.append(loss)
    collapse = accuracy_collapse(info, int8_acc, y_test)
    if collapse:
        warnings.append(collapse)
    contradictory = contradictory_rows_warning(dataset.X, dataset.y)
    if contradictory:
        warnings.append(contradictory)
    # The receive ring takes only SRAM left free, so it is no part of the margin (a tight model gets a small ring).
    margin = board.sram_bytes - sram["estimated_total_bytes"] + wire.rx_ring_static_bytes(sram["rx_ring_bytes"])
    if margin < 256:
        warnings.append(f"estimated SRAM margin is only {margin} B")
    cycles = predict_cycles(model)
    return {
        "model": family,
        "dataset": dataset.name,
        "seed": seed,
        "board": board.name,
        "budget_bytes": budget_bytes,
        "model_bytes": ledger.model_bytes,
        "model_hash": f"0x{model_hash(model):08X}",
        "ledger": ledger.to_dict(),
        "sram_estimate": sram,
        "hyperparameters": info["chosen"],
        "solver": {k: v for k, v in info.items() if k != "chosen"},
        "n_features": model.n_features,
        "n_classes": model.n_classes,
        "n_train": int(dataset.X.shape[0] - len(y_test)),
        "n_test": int(len(y_test)),
        "float_accuracy": float_acc,
        "int8_accuracy": int8_acc,
        "int8_float_agreement": float(np.mean(float_pred == int8_pred)),
        "train_seconds": round(train_seconds, 2),
        "predicted_cycles": cycles,
        "predicted_latency_ms": 1000.0 * cycles["total"] / board.f_cpu_hz,
        "max_latency_ms": info.get("max_latency_ms"),
        "runners_up": info.get("runners_up", []),
        "auto": info.get("auto"),  # --model auto: every family's validated accuracy, or why it was refused
        "warnings": warnings,
    }
