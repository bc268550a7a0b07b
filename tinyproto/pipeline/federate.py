"""`tinyproto federate`: one FlyNN trained by N parties that keep their rows, written as a normal model directory.

The fixed stratified split (25 % test, seed 0) is made first; the parties divide the *training* part
(`--split`), the test part is the held-out set of every reported figure, as in `compile`. The protocol is in
tinyproto/federated/ (protocol.py; model selection: selection.py); this module runs it and writes
the directory with `compile.write_model_directory` (same files and checks as `compile`, so `build`, `flash`
and `validate` work on it) plus the federation's keys in report.json. Two references are trained on the pooled
training rows, which no party could do:

* what `compile --model flynn` would deploy (its own solver on the pooled rows): the accuracy and bytes the
  federation is compared with (`compile_accuracy`, `accuracy_vs_compile_points`);
* the federated configuration trained on the pooled rows: its counts must equal the federated ones exactly
  without DP (`counts_equal_pooled`), the check that the all-reduces lose nothing.

Layer: pipeline (orchestration).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.option_lists import MAX_SEED, comma_items
from tinyproto.pipeline.interrupts import interrupts_kept

BACKENDS = ("dask", "local", "sim", "port")
DEVICE_BACKENDS = ("sim", "port")  # parties that learn on a (simulated) Uno: federated/device_parties.py


@dataclass(frozen=True)
class FederateResult:
    out_dir: Path
    report: dict


def default_dp_T(n_classes: int, n_hashes: int) -> int:
    """T when --dp-T is not given: L·m/64 of the L·m counts (at least one).

    Smaller T means less noise per released count (Laplace scale 2Tτ/ε) and a sharper exponential mechanism,
    but fewer filter bits set; in tools/bench_federated.py L·m/64 is near the best T for ε in 1..4 on the
    synthetic data (digits prefers even fewer). It depends on the data only through L and m, which are public.
    """
    return max(1, (n_classes * n_hashes) // 64)




@dataclass(frozen=True)
class FederateOptions:
    """How `tinyproto federate` runs: the parties and how the rows are split among them, the differentially
    private release, where the parties run, and the model's budget, board and seed."""

    parties: int = 2
    split_spec: str = "iid"  # --split: iid, dirichlet:ALPHA, ...
    dp_epsilon: float | None = None  # None: the exact counts are released
    dp_T: int | None = None  # None: default_dp_T
    backend: str = "dask"  # one of BACKENDS
    scheduler: str | None = None  # a running dask scheduler (--backend dask); None: a LocalCluster
    workers: int | None = None  # the LocalCluster's workers
    processes: bool = False  # LocalCluster workers as processes
    ports: str | None = None  # --backend port: one board per party, comma separated
    timeout: float | None = None  # seconds to start the cluster (None: dask_parties.CONNECT_TIMEOUT)
    seed: int = 0
    budget: str = "2kB"
    board_name: str = "uno"
    label: str | None = None  # DATA's label column


def check_arguments(options: FederateOptions) -> None:
    """Everything that can be refused before any data is read (one-line TinyprotoError each)."""
    o = options
    parties, dp_epsilon, dp_T, backend, scheduler, ports = (o.parties, o.dp_epsilon, o.dp_T, o.backend, o.scheduler,
                                                            o.ports)
    seed, workers, processes, timeout, split_spec = o.seed, o.workers, o.processes, o.timeout, o.split_spec
    if parties < 1:
        raise TinyprotoError(f"--parties must be at least 1, got {parties}")
    if not 0 <= seed <= MAX_SEED:
        raise TinyprotoError(f"--seed must be in 0..{MAX_SEED}, got {seed}")
    if workers is not None and workers < 1:
        raise TinyprotoError(f"--workers must be at least 1, got {workers}")
    if workers is not None and (backend != "dask" or scheduler):
        raise TinyprotoError("--workers sets the LocalCluster's workers: it needs --backend dask without "
                             "--scheduler")
    if processes and (backend != "dask" or scheduler):
        raise TinyprotoError("--processes runs LocalCluster workers as processes: it needs --backend dask "
                             "without --scheduler")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise TinyprotoError(f"--timeout must be a positive number of seconds, got {timeout}")
    if split_spec is not None:
        from tinyproto.federated.shards import parse_split

        parse_split(split_spec)
    if dp_epsilon is not None and not (dp_epsilon > 0 and math.isfinite(dp_epsilon)):
        raise TinyprotoError(f"--dp-epsilon must be a positive number, got {dp_epsilon}")
    if dp_T is not None and dp_T < 1:
        raise TinyprotoError(f"--dp-T must be at least 1, got {dp_T}")
    if dp_T is not None and dp_epsilon is None:
        raise TinyprotoError("--dp-T needs --dp-epsilon (T only matters for the differentially private release)")
    if backend not in BACKENDS:
        raise TinyprotoError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if scheduler and backend != "dask":
        raise TinyprotoError("--scheduler needs --backend dask")
    if (ports is not None) != (backend == "port"):
        raise TinyprotoError("--backend port needs --ports P1,P2,... (one board per party)" if ports is None
                             else "--ports needs --backend port")
    if ports is not None:
        from tinyproto.federated.device_parties import check_ports

        check_ports(comma_items(ports, "--ports"), parties)


@contextmanager
def open_backend(options: FederateOptions, shards: list, *, board=None, dataset: str = "federated",
                 budget_bytes: int = 0, progress: Callable[[str], None] | None = None) -> Iterator:
    """The parties, placed (options.backend): in this process (local), on dask workers (a LocalCluster unless
    --scheduler), or on devices that learn their shard (sim: one simulated Uno per party; port: one board per
    port)."""
    from tinyproto.federated.local_parties import LocalBackend

    kind, ports, timeout = options.backend, options.ports, options.timeout

    if kind == "local":
        backend = LocalBackend(shards)
    elif kind in DEVICE_BACKENDS:
        from tinyproto.federated.device_parties import DeviceBackend

        port_list = None if kind == "sim" else comma_items(ports, "--ports")
        backend = DeviceBackend(shards, board, port_list, dataset=dataset,
                                budget_bytes=budget_bytes, progress=progress)
    else:
        import importlib.util

        if importlib.util.find_spec("distributed") is None:
            raise TinyprotoError("--backend dask needs dask.distributed: pip install 'dask[distributed]' "
                                 "(or use --backend local)")
        from tinyproto.federated.dask_parties import CONNECT_TIMEOUT, DaskBackend

        # (its cluster's workers start deaf to Ctrl-C, and it closes what it opened when its start fails)
        backend = DaskBackend(shards, scheduler=options.scheduler, n_workers=options.workers,
                              processes=options.processes, timeout=CONNECT_TIMEOUT if timeout is None else timeout)
    try:
        yield backend
    finally:
        backend.close()


def federate_model(data: str = "digits", options: FederateOptions | None = None, out: Path | None = None,
                   progress: Callable[[str], None] | None = None) -> FederateResult:
    """Train FlyNN across options.parties parties (optionally with DP) and write the model directory; see the
    module doc."""
    from tinyproto.core.dask_cluster import refuse_in_a_worker_importing_main

    refuse_in_a_worker_importing_main("tinyproto's federate_model()")  # before any file is touched
    o = options or FederateOptions()
    parties, dp_epsilon, dp_T, backend, split_spec, seed = (o.parties, o.dp_epsilon, o.dp_T, o.backend, o.split_spec,
                                                            o.seed)
    from tinyproto.core.outdir import check_model_output_dir

    if out is not None:  # an unusable --out is refused now, before the heavy imports and the data
        check_model_output_dir(Path(out))
    from tinyproto.core.boards import load_board
    from tinyproto.core.budget import parse_budget
    from tinyproto.families import buffer_room
    from tinyproto.pipeline.compile import Fitted, TrainedOn, write_model_directory
    from tinyproto.core.datasets import default_out_dir, load_dataset, split
    from tinyproto.federated.dp import DPParams
    from tinyproto.federated.party import party_accuracy
    from tinyproto.federated.protocol import agree_classes, central_fit, choose_config, federated_fit
    from tinyproto.federated.shards import parse_split, split_parties

    with interrupts_kept() as interrupted:

        def say(message: str) -> None:
            interrupted()  # every progress step is a point where a lost Ctrl-C is raised again
            if progress:
                progress(message)

        check_arguments(o)
        split_kind = parse_split(split_spec)
        budget_bytes = parse_budget(o.budget)
        # compile's calibration puts no array in flash, so the federated model has the whole budget too: without DP
        # its counts are the very ones compile deploys (a federated model has no calibration: it would need every
        # party's rows again)
        model_budget = budget_bytes
        board = load_board(o.board_name)
        from tinyproto.device.build import check_mcu_known

        check_mcu_known(board)
        dataset = load_dataset(data, label=o.label)
        sp = split(dataset)
        from tinyproto.pipeline.compile import refuse_too_many_classes

        refuse_too_many_classes(len(np.unique(sp.y_train)), board)
        n_train = len(sp.y_train)
        if parties > n_train:
            raise TinyprotoError(f"--parties {parties} is more than the {n_train} training rows of {dataset.where}")
        out_dir = Path(out) if out is not None else default_out_dir(dataset, "-federated")
        if out is None:  # the default --out is named after the data set: refused now, before the parties train
            check_model_output_dir(out_dir)

        rows = split_parties(sp.y_train, parties, split_kind, seed)
        shards = [(sp.X_train[r], sp.y_train[r]) for r in rows]
        party_classes = [int(np.unique(y).size) for _, y in shards]
        say(f"{parties} parties ({split_kind}): {', '.join(str(len(r)) for r in rows)} rows")

        started = time.perf_counter()
        with open_backend(o, shards, board=board, dataset=dataset.name, budget_bytes=budget_bytes,
                          progress=say) as parties_backend:
            say(f"backend: {_describe(parties_backend.describe())}")
            classes = agree_classes(parties_backend)
            limit = None
            if backend in DEVICE_BACKENDS:  # the counts must fit the learning firmware (as compile --learnable)
                from tinyproto.federated.config import device_count_limit

                limit = device_count_limit(board, sp.X_train.shape[1], len(classes))
            room = buffer_room(board, sp.X_train.shape[1], len(classes), streamable=False)  # as compile's solver
            config, info = choose_config(parties_backend, model_budget, seed, classes, sp.X_train.shape[1],
                                         dp=dp_epsilon is not None, count_limit=limit, sram_room=room, progress=say)
            say(f"hyper-parameters: m={config.n_hashes} s={config.n_inputs_per_hash} rho={config.n_winners} "
                f"bits={config.count_bits} "
                f"({'data-independent default (DP)' if dp_epsilon is not None else 'federated selection'})")
            dp = None
            if dp_epsilon is not None:
                n_counts = len(classes) * config.n_hashes
                T = dp_T if dp_T is not None else default_dp_T(len(classes), config.n_hashes)
                if T > n_counts:
                    say(f"--dp-T {T} is more than the {n_counts} counts (L x m): "
                        f"every count is released, T = {n_counts}")
                dp = DPParams(float(dp_epsilon), min(int(T), n_counts), parties,
                                  T_requested=None if dp_T is None else int(dp_T))
            fit = federated_fit(parties_backend, config, classes, dp=dp, seed=seed, progress=say)
            train_accuracy = parties_backend.map(party_accuracy, parties_backend.handles, fit.model)
            cluster = parties_backend.describe()
        federated_seconds = time.perf_counter() - started

        say("reference 1: the same configuration trained on the pooled rows (exact check of the counts)")
        central = central_fit(sp.X_train, sp.y_train, config, classes)
        say("reference 2: what compile would deploy (its solver on the pooled rows)")
        reference = _compile_reference(sp, model_budget, seed, board, backend in DEVICE_BACKENDS)
        extra = _federation_report(fit, central, reference, sp, rows, party_classes, train_accuracy, split_kind,
                                   backend, cluster, dp, info, federated_seconds)
        interrupted()  # a Ctrl-C that a finalizer swallowed still means: write nothing
        result = write_model_directory(Fitted(fit.clf, fit.model, info, federated_seconds),
                                       TrainedOn(dataset, sp, seed, budget_bytes, board), out_dir, progress,
                                       extra_report=extra, verb="federate")
        return FederateResult(result.out_dir, result.report)


def _compile_reference(sp, budget_bytes: int, seed: int, board, learnable: bool) -> dict:
    """`compile --model <the federated family>` on the pooled training rows (with --learnable's cap for device
    parties): its int8 test accuracy, bytes and hyper-parameters."""
    from tinyproto import families
    from tinyproto.families import SolveOptions
    from tinyproto.federated.config import FAMILY

    options = SolveOptions(budget_bytes, seed, f_cpu_hz=board.f_cpu_hz, learn_on=board if learnable else None,
                           board=board)
    _, model, info = families.fit_under_budget(FAMILY, sp.X_train, sp.y_train, options)
    return {"accuracy": float(np.mean(model.predict(sp.X_test) == sp.y_test)), "model_bytes": model.model_bytes(),
            "hyperparameters": info["chosen"], "cv_accuracy": info["cv_accuracy"],
            "digests": deployed_digests(model, seed, budget_bytes), "seed": seed, "budget_bytes": budget_bytes}


def deployed_digests(model, seed: int, budget_bytes: int) -> dict:
    """What makes two deployed models the same: the int_model's digest, the model hash and the rendered header's
    SHA-256 (rendered with the same banner for both, so only the model can make them differ)."""
    import hashlib

    from tinyproto.core.modeldir import int_model_digest
    from tinyproto.core.render import model_hash, render_header

    header = render_header(model, "pooled", seed, budget_bytes)
    return {"int_model_sha256": int_model_digest(model.to_json()), "model_hash": f"0x{model_hash(model):08X}",
            "header_sha256": hashlib.sha256(header.encode()).hexdigest()}


def _federation_report(fit, central, reference, sp, rows, party_classes, train_accuracy, split_kind, backend,
                       cluster, dp, info, seconds) -> dict:
    """The report keys `compile` does not have."""
    from tinyproto.federated.stats import INPUT_QUANTILE

    pred = fit.model.predict(sp.X_test)
    central_pred = central.model.predict(sp.X_test)
    on_device = backend in DEVICE_BACKENDS
    if on_device:  # devices release saturated counts only: compare the deployed (re-saturated) counts
        same_counts = bool(np.array_equal(fit.model.counts, central.model.counts))
        differing = int(np.count_nonzero(fit.model.counts != central.model.counts))
    else:
        same_counts = bool(np.array_equal(fit.int_counts, central.int_counts)
                           and np.array_equal(fit.float_counts, central.float_counts))
        differing = int(np.count_nonzero(fit.int_counts != central.int_counts))
    accuracy = float(np.mean(pred == sp.y_test))
    digests = deployed_digests(fit.model, reference["seed"], reference["budget_bytes"])
    chosen = {k: v for k, v in info["chosen"].items()}
    compile_chosen = {k: v for k, v in reference["hyperparameters"].items() if k != "learnable"}
    return {
        "parties": len(rows),
        "split": str(split_kind),
        "backend": backend,
        "cluster": cluster,
        "dp": dp.to_json() if dp is not None else None,
        "accuracy": accuracy,
        "compile_accuracy": reference["accuracy"],
        "compile_model_bytes": reference["model_bytes"],
        "accuracy_vs_compile_points": round(100 * (accuracy - reference["accuracy"]), 4),
        "compile_hyperparameters": reference["hyperparameters"],
        # true only when the deployed model is the very model compile deploys from the pooled rows (hashes compared)
        "identical_to_compile": digests == reference["digests"],
        "digests": digests,
        "compile_digests": reference["digests"],
        "hyperparameters_equal_compile": chosen == compile_chosen,
        "compile_reference": "tinyproto compile --model flynn with the same budget and seed on the pooled training "
                             "rows" + (" (--learnable)" if on_device else "") + ", scored on the same test split; "
                             "compared without compile's calibration, which a federated model does not carry",
        "pooled_same_config_accuracy": float(np.mean(central_pred == sp.y_test)),
        "counts_equal_pooled": same_counts,
        "counts_differing_from_pooled": differing,
        "prediction_agreement_with_pooled": float(np.mean(pred == central_pred)),
        "pooled_reference": "the federated configuration trained on the pooled training rows: without DP its "
                            "counts equal the federated counts exactly",
        "compared_counts": ("the deployed integer counts, saturated to the count bits (each device releases its "
                            "counts saturated; the sum is saturated again, which equals saturating the pooled "
                            "counts); the device adds no DP noise, the party's host does after reading" if on_device
                            else "the integer and float models' counts, summed before saturation"),
        "party_rows": [len(r) for r in rows],
        "party_classes": party_classes,
        "party_train_accuracy": train_accuracy,
        "hyperparameter_source": info["hyperparameter_source"],
        "selection": {"validation": info.get("validation"), "cv_accuracy": info.get("cv_accuracy"),
                      "candidates": len(info.get("candidates", [])), **info["selection_communication"]},
        "protocol": {
            "allreduce_rounds": 3 + fit.quantile_rounds,  # classes, moment sums, quantile search, counts
            "quantile_rounds": fit.quantile_rounds,
            "standardisation": "exact all-reduce of n, sum x, sum x^2 per feature (integer arithmetic)",
            "input_scale": f"exact distributed {INPUT_QUANTILE:g} quantile of |z| (search over float64 bit "
                           "patterns)",
            "input_scale_value": fit.spec.input_scale,
            "seed_of_M": fit.spec.config.seed,
        },
        "federated_seconds": round(seconds, 2),
    }


def _describe(cluster: dict) -> str:
    if cluster["name"] == "local":
        return "local (every party in this process)"
    if cluster["name"] == "sim":
        return f"sim ({cluster['devices']} simulated Unos learning on-device)"
    if cluster["name"] == "port":
        return f"port ({', '.join(cluster['ports'])}, learning on-device)"
    mode = {True: "processes", False: "threads", None: "remote"}[cluster["processes"]]
    return f"dask {cluster['scheduler']} ({cluster['workers']} workers, {mode})"
