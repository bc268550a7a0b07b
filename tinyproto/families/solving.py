"""The one contract every family's budget solver keeps: what it is asked (SolveOptions) and how it is called
(FitUnderBudget: `fit_under_budget(X_train, y_train, options) -> (float estimator, IntModel, info)`).

Every caller (compile, --model auto, sweep, federate, learn, benchmarks, tests) builds one SolveOptions and calls
a family's solver with it; no solver takes its own names for the same things. tests/test_solver_contract.py checks
every registered family's solver against FitUnderBudget by its signature.
Layer: families.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from tinyproto.core.errors import TinyprotoError

if TYPE_CHECKING:  # the board is only carried, never read here
    from tinyproto.core.boards import Board
    from tinyproto.core.folds import Folds

DEFAULT_F_CPU_HZ = 16_000_000


@dataclass(frozen=True)
class SolveOptions:
    """What a family's solver is asked to do. Every field has one name and one meaning for every family.

    budget_bytes: the hard limit on the model's flash bytes (Σ CArray.nbytes of the rendered model).
    seed: every random choice of the search and the fit derives from it (same seed, same model, byte for byte).
    max_latency_ms: the user's limit on predicted milliseconds per inference at f_cpu_hz (the family's cost model,
        with headroom); None: no user limit (a family may keep a default cap of its own, e.g. FlyNN's).
    f_cpu_hz: the board's clock, for latency limits and the predicted milliseconds reported.
    n_jobs: worker processes the solver may use to evaluate candidates (results never depend on it).
    progress: receives one-line status messages.
    folds: the validation yardstick (tinyproto.core.folds.Folds) every candidate of every family is scored on;
        None: the solver draws the standard one for the rows it is given (Folds.standard(X, y, seed)).
    learn_on: a board the model must also learn on (`compile --learnable`): a learnable family fits its counts
        into what that board holds while learning; a family that cannot learn refuses it.
    board: the board the model deploys to; a family whose buffers grow with a knob of its own (FlyNN's top-ρ
        heap) keeps them within what that board's SRAM leaves beside the device app (buffer_room). None: no limit
        (compile checks every model against its board afterwards in any case).
    clip_check: with an unknown rate, also fit the clip check (core/confidence.fit_clip_check: decline inputs with
        more than a few int8 values at the clip); False: the threshold alone.
    fold_models: where a solver may leave the integer models of the shape it chose that it already trained on
        folds' training rows (FoldModels); the confidence calibration then reuses them instead of training the
        shape again. None: nobody asks.
    """

    budget_bytes: int
    seed: int = 0
    max_latency_ms: float | None = None
    f_cpu_hz: int = DEFAULT_F_CPU_HZ
    n_jobs: int = 1
    progress: Callable[[str], None] | None = None
    folds: Folds | None = None
    learn_on: Board | None = None
    fold_models: FoldModels | None = None
    board: Board | None = None
    clip_check: bool = False

    def __post_init__(self) -> None:
        from tinyproto.core.option_lists import api_int, api_number, check_seed

        # each field's type too: from Python, budget_bytes="1kB" or seed=-1 raised ValueError from int() or numpy
        if api_int(self.budget_bytes, "budget_bytes (use tinyproto.core.budget.parse_budget('1kB'))") < 1:
            raise TinyprotoError(f"the budget must be at least 1 byte, got {self.budget_bytes}")
        check_seed(self.seed, "seed")
        if self.max_latency_ms is not None and not (api_number(self.max_latency_ms, "max_latency_ms") > 0
                                                    and math.isfinite(self.max_latency_ms)):
            raise TinyprotoError(f"--max-latency must be a positive number of milliseconds, got {self.max_latency_ms}")
        if api_int(self.n_jobs, "n_jobs (--jobs)") < 1:
            raise TinyprotoError(f"--jobs must be at least 1, got {self.n_jobs}")
        if api_int(self.f_cpu_hz, "f_cpu_hz") < 1:
            raise TinyprotoError(f"the clock must be a positive number of Hz, got {self.f_cpu_hz}")

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def buffer_room(self, n_features: int, n_classes: int, streamable: bool) -> int | None:
        """SRAM bytes left on options.board for a family's own buffers (None: no board given): the board's SRAM
        less the device app's (its frame buffer, its own state, and the int8 input buffer of a family that does
        not stream) and the board's reserve for call frames. The receive ring only takes what is left free."""
        if self.board is None:
            return None
        return buffer_room(self.board, n_features, n_classes, streamable)

    def with_(self, **changes: Any) -> SolveOptions:
        """A copy with some fields changed (the options are frozen)."""
        return replace(self, **changes)


def buffer_room(board: Board, n_features: int, n_classes: int, streamable: bool) -> int:
    """SolveOptions.buffer_room for this board (negative: not even the device app fits)."""
    from tinyproto.core.wire import app_sram

    app = app_sram(n_features, n_classes, streamable, rx_ring=0)
    return board.sram_bytes - app.total - board.sram_reserved_bytes


class FoldModels:
    """The chosen shape's integer models on validation folds, left by a solver for the calibration that follows.

    A model is offered for (the solver's info["chosen"], the index of the fold in options.folds.splits()) only
    when it is exactly what the family's fit_shape returns on that fold's training rows with the same options
    (the same rows, seed, budget and latency limit): taking it instead of training again changes nothing.
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str, int], Any] = {}

    @staticmethod
    def _key(chosen: dict, fold: int) -> tuple[str, int]:
        import json

        return json.dumps(chosen, sort_keys=True, default=str), int(fold)

    def offer(self, chosen: dict, fold: int, model: Any) -> None:
        self._models[self._key(chosen, fold)] = model

    def offer_all(self, chosen: dict, models: dict[int, Any]) -> None:
        for fold, model in models.items():
            self.offer(chosen, fold, model)

    def take(self, chosen: dict, fold: int) -> Any | None:
        """The model left for this shape and fold, or None (then the caller trains it)."""
        return self._models.get(self._key(chosen, fold))

    def __len__(self) -> int:
        return len(self._models)


def calibration_splits(folds: Folds) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(index in folds.splits(), training rows, validation rows) of the folds the confidence calibration trains the
    chosen shape on: those of the first draw of the folds (the first of folds.splits(), in the same order)."""
    return [(index, fit_rows, val_rows) for index, (fit_rows, val_rows) in enumerate(folds.splits(repeat=0))]


def fit_final_and_folds(final: Callable, final_args: tuple, fit_shape: Callable, chosen: dict, X: np.ndarray,
                        y: np.ndarray, options: SolveOptions) -> tuple[Any, dict[int, Any]]:
    """(final(*final_args), {fold index: model}): the solver's fit of its chosen shape on all its rows and, when
    options.fold_models asks for them, the chosen shape trained (fit_shape, as the calibration would) on every
    calibration fold no model was left for yet, all in the same options.n_jobs processes. The caller leaves the
    fold models (FoldModels.offer) under its info["chosen"], which may depend on the final model.

    `final` and `fit_shape` run in worker processes: module-level functions, and their arguments picklable."""
    from tinyproto.core.folds import Folds

    missing = []
    if options.fold_models is not None:
        folds = options.folds if options.folds is not None else Folds.standard(X, y, options.seed)
        quiet = options.with_(progress=None, fold_models=None)
        missing = [(index, (fit_shape, X[fit_rows], y[fit_rows], chosen, quiet))
                   for index, fit_rows, _ in calibration_splits(folds)
                   if options.fold_models.take(chosen, index) is None]
    results = map_in_processes(_call, [(final, final_args), *[(_shape_or_none, args) for _, args in missing]],
                               options.n_jobs)
    return results[0], {index: model for (index, _), model in zip(missing, results[1:]) if model is not None}


def _call(function: Callable, args: tuple) -> Any:
    return function(*args)


def _shape_or_none(fit_shape: Callable, X: np.ndarray, y: np.ndarray, chosen: dict, options: SolveOptions) -> Any:
    """The integer model of fit_shape, or None when the shape cannot keep the limits on these rows (the
    calibration then does what it does for such a fold)."""
    try:
        return fit_shape(X, y, chosen, options)[1]
    except TinyprotoError:
        return None


# Sets the default of --jobs for every command a process starts (a CI job or test runner that already keeps every
# core busy with processes of its own sets 1: a solver's pool there only fights them for the same cores and pays
# each worker's start, about 1.5 s of CPU).
JOBS_VARIABLE = "TINYPROTO_JOBS"


def default_jobs() -> int:
    """Worker processes a solver may use when the user sets none: 1 inside a dask worker (sweep and federate
    already spread their work over the cluster; a pool inside each of its workers would only fight it for the same
    cores), else $TINYPROTO_JOBS when set, else the cores this process may run on."""
    import sys

    if "distributed" in sys.modules:  # a dask worker has imported it; importing it here only costs ~0.5 s
        from distributed import get_worker

        try:
            get_worker()
            return 1
        except ValueError:
            pass
    configured = os.environ.get(JOBS_VARIABLE, "").strip()
    if configured:
        try:
            jobs = int(configured)
        except ValueError:
            jobs = 0
        if jobs < 1:
            raise TinyprotoError(f"{JOBS_VARIABLE} must be a whole number of processes, at least 1; got "
                                 f"{configured!r}")
        return jobs
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


_THREADPOOLS: tuple[int, Any] | None = None  # (modules imported when it was made, the ThreadpoolController)


def one_thread(user_api: str | None = None):
    """threadpoolctl.threadpool_limits(limits=1, user_api=user_api), through one ThreadpoolController for as long as
    no module has been imported since it was made (scikit-learn keeps one controller the same way). A new controller
    per fit looked every loaded library up again: ~3 ms, 112 times in a compile of wine at 1 kB (8 % of its CPU). A
    library that could need limiting arrives with an import (numpy's and scipy's BLAS, scikit-learn's OpenMP), and
    any import makes a new controller that sees it."""
    from threadpoolctl import ThreadpoolController

    global _THREADPOOLS
    modules = len(sys.modules)
    if _THREADPOOLS is None or _THREADPOOLS[0] != modules:
        _THREADPOOLS = (modules, ThreadpoolController())
    return _THREADPOOLS[1].limit(limits=1, user_api=user_api)


def map_in_processes(function: Callable, argument_tuples: list[tuple], n_jobs: int) -> list:
    """[function(*args) for args in argument_tuples] in this process and up to n_jobs - 1 worker processes (loky,
    reused from one call to the next), results in the order given.

    This process starts on the tasks at once (from the front of the list) while the workers start (each imports
    numpy, scikit-learn and tinyproto: about 1.5 s of CPU) and then take tasks from the back. Every task runs with
    one BLAS thread wherever it runs, so a result never depends on the process that computed it or on n_jobs. An
    exception of a task is raised here (the first task's, in list order, when several fail)."""
    jobs = min(int(n_jobs), len(argument_tuples))
    if jobs <= 1:
        with one_thread("blas"):
            return [function(*args) for args in argument_tuples]
    from collections import deque

    from joblib.externals.loky import get_reusable_executor

    with _workers_deaf_to_ctrl_c():
        executor = get_reusable_executor(max_workers=jobs - 1, initializer=_end_with_the_parent,
                                         initargs=(os.getpid(),))
    pending = deque(range(len(argument_tuples)))
    results: list = [None] * len(argument_tuples)
    failures: dict[int, BaseException] = {}
    in_flight: dict[int, Any] = {}
    workers_ready = False  # a worker has returned a result: it has started (imports done)

    def collect(block: bool) -> None:
        from concurrent.futures import FIRST_COMPLETED, wait

        nonlocal workers_ready
        done, _ = wait(list(in_flight.values()), timeout=None if block else 0, return_when=FIRST_COMPLETED)
        workers_ready = workers_ready or bool(done)
        for index in [i for i, future in in_flight.items() if future in done]:
            future = in_flight.pop(index)
            try:
                results[index] = future.result()
            except BaseException as exc:  # noqa: BLE001  (re-raised below, in list order)
                failures[index] = exc

    with one_thread("blas"):
        while pending and not failures:
            # A started worker keeps its next task at hand while this process computes one; a starting one gets
            # one task. The workers never hold more queued tasks than are left here, so all finish about together.
            depth = (2 if workers_ready else 1) * (jobs - 1)
            while len(pending) > len(in_flight) and len(in_flight) < depth:
                index = pending.pop()
                with _workers_deaf_to_ctrl_c() if not in_flight and not workers_ready else nullcontext():
                    # (the first submit starts the workers; later ones find them running)
                    in_flight[index] = executor.submit(_with_one_blas_thread, function, argument_tuples[index])
            if pending:
                index = pending.popleft()
                try:
                    results[index] = function(*argument_tuples[index])
                except BaseException as exc:  # noqa: BLE001
                    failures[index] = exc
            if in_flight:
                collect(block=False)
        while in_flight:
            collect(block=True)
    if failures:
        raise failures[min(failures)]
    return results


@contextmanager
def _workers_deaf_to_ctrl_c() -> Iterator[None]:
    """SIGINT ignored while loky starts its worker processes (the executor and the first submit, which spawns
    them): they inherit the ignored disposition through exec and never see the terminal's Ctrl-C, which signals the
    whole process group (one that got it while importing printed a KeyboardInterrupt traceback over the user's
    terminal); this process shuts them down. As with dask's fork server, a Ctrl-C in those milliseconds is not
    seen (a blocked SIGINT would only land in numpy's BLAS threads, where the ignored disposition drops it too);
    never while this process computes. Only Python's own handler is replaced."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None):
        yield
        return
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)


def _end_with_the_parent(parent: int) -> None:
    """A worker ends when the process that started it dies (Linux's parent-death signal). Without it a compile
    killed by SIGKILL left its workers computing their queued fits for minutes, holding its output pipes open."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG; elsewhere than Linux there is no prctl
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the signal was asked for (the worker adopted by init or a reaper)
        os._exit(1)


def _with_one_blas_thread(function: Callable, args: tuple) -> Any:
    """A task in a worker process, with one BLAS thread (as in the parent: the same arithmetic everywhere)."""
    with one_thread("blas"):
        return function(*args)


class FitUnderBudget(Protocol):
    """A family's budget solver. It never exceeds options.budget_bytes and raises TinyprotoError, naming the
    minimum, when nothing fits. info["chosen"] holds the hyper-parameters; info["chosen_validation"] the chosen
    candidate's validation on the training rows only ("val_int8_accuracy", and per fold of options.folds
    "fold_accuracies"), which `--model auto` compares across families."""

    def __call__(self, X_train: np.ndarray, y_train: np.ndarray,
                 options: SolveOptions) -> tuple[Any, Any, dict]: ...  # (estimator, IntModel, info)


class FitShape(Protocol):
    """A family's chosen shape trained again, with no search: `fit_shape(X_train, y_train, chosen, options)` ->
    (float estimator, IntModel), where `chosen` is the info["chosen"] its fit_under_budget returned (JSON-able:
    the shape is recoverable from the solver's own report). Every random choice derives from options.seed as the
    solver's final fit does, so on the rows the solver was given it returns the solver's model bit for bit
    (tests/test_family_contract.py); on other rows (a validation fold's) the same shape trained on those. The
    budget and latency limits of options are kept as the solver keeps them for its final model; a shape that
    cannot keep them on these rows raises TinyprotoError."""

    def __call__(self, X_train: np.ndarray, y_train: np.ndarray, chosen: dict,
                 options: SolveOptions) -> tuple[Any, Any]: ...  # (estimator, IntModel)


__all__ = ["DEFAULT_F_CPU_HZ", "FitShape", "FitUnderBudget", "FoldModels", "JOBS_VARIABLE", "SolveOptions",
           "calibration_splits", "default_jobs", "fit_final_and_folds", "map_in_processes"]


def training_classes(X: np.ndarray, y: np.ndarray, family_title: str, min_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(the classes, each row's class index) of a solver's training rows, refused in one line unless X is a 2-D
    matrix with one label per row, at least min_rows of them, and at most 255 classes (a label is one byte on the
    device, 255 being "unknown")."""
    if X.ndim != 2 or len(X) != len(y) or len(X) < min_rows:
        raise TinyprotoError(f"{family_title} needs a 2-D feature matrix with one label per row (at least {min_rows} "
                             "rows)")
    classes, y_index = np.unique(y, return_inverse=True)
    if classes.size > 255:
        raise TinyprotoError(f"{family_title} supports at most 255 classes, got {classes.size}")
    return classes, y_index
