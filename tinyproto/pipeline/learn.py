"""`tinyproto learn`: FlyNN learns on the device, and the host proves it learned exactly what the host would.

FlyNN's training is one pass of counting (t_lj = how many samples of class l set hash bit j, saturated to b bits),
so the microcontroller can do it itself. The learning firmware is the model's normal firmware built with
`TP_FLYNN_LEARN` (firmware/tp_flynn.c, firmware/tp_main.c): the packed counts move from flash to SRAM (seeded from
the compiled counts at start-up), LEARN adds one labelled int8 sample, inference reads the SRAM counts, and
EEPROM_SAVE / EEPROM_LOAD persist them (only changed bytes are written). M stays seeded or in flash: no SRAM.

The flow (`learn_on_device`):

1. check that L x m x b bits of counts fit the SRAM next to the app's buffers, the inference stack and the
   board's reserve (and the EEPROM with --save-eeprom) -- before anything is built, with one error that says
   the largest m that fits;
2. build the learning firmware in DIR/learning/ (PlatformIO project of its own; the model's normal firmware is
   untouched);
3. CLEAR, stream the training split of DATA as int8 vectors (the model's InputStage) with class indices,
   READ_COUNTS back in chunks, compare with the host's counts (the integer reference's FlyHash on the same int8
   vectors, counted and saturated like IntFlyNN.from_classifier);
4. run the model directory's test vectors on the learned SRAM counts: score vectors must equal the reference;
5. with --save-eeprom: EEPROM_SAVE, restart the device (the simulator keeps its EEPROM in a file) and check that
   EEPROM_LOAD restores the same counts;
6. write DIR/learned/ (a model directory whose model.json holds the learned counts, built with the normal
   firmware, so `tinyproto validate DIR/learned` checks it bit-exactly) and DIR/learn.json.

Layer: pipeline (orchestration only). FlyNN's learning sizes and the host's counts are in
families/flynn/learning.py; the learning firmware and the device dialogue in federated/device_learning.py, which
the federated device parties share.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tinyproto import families
from tinyproto.core.boards import Board, load_board
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.manifest import record_outputs
from tinyproto.core.measured import cycle_problem, stack_problem
from tinyproto.core.modeldir import ModelDir, TestVectors, int_model_digest, load_model_dir
from tinyproto.core.safe_io import write_json
from tinyproto.core.outdir import atomic_directory, locked
from tinyproto.federated.device_learning import (
    LEARN_FLAGS, Target, build_learning_firmware, check_learning_device, class_indices, predict_vectors,
    stream_samples, write_learning_project,
)

LEARNING_DIR = "learning"  # the learning firmware's project, inside the model directory
LEARNED_DIR = "learned"  # the learned model, a model directory of its own
EEPROM_IMAGE = "eeprom.bin"  # the simulated Uno's EEPROM, kept across runs in LEARNING_DIR

ProgressFactory = Callable[[str], Callable[[int], None]]


def require_learnable(model, board: Board, save_eeprom: bool):
    """The model's family must learn on the device and its counts must fit (refused before anything is built):
    the sizes the learning needs (families.Learning.check)."""
    if not families.family_of(model).learnable:
        learnable = families.learnable_names()
        raise TinyprotoError(
            f"only {', '.join(families.family(n).title for n in learnable)} learns on the device (this model is "
            f"{getattr(model, 'family', '?')}); compile with --model {' or '.join(learnable)} --learnable"
        )
    return families.family_of(model).learning.check(model, board, save_eeprom)


def training_samples(model, data: str, label: str | None) -> tuple[str, np.ndarray, np.ndarray]:
    """(data name, int8 training vectors, class indices): DATA's training split through the model's input stage."""
    from tinyproto.core.datasets import load_dataset, split

    dataset = load_dataset(data, label=label)
    if dataset.X.shape[1] != model.n_features:
        n = dataset.X.shape[1]  # named as given (--data d.csv, not the data set's name "d")
        raise TinyprotoError(f"--data {data} has {n} feature{'s' if n != 1 else ''}, the model was compiled on "
                             f"{model.n_features}: learn data with the model's features")
    sp = split(dataset)
    return dataset.name, model.input_stage.quantize(sp.X_train), class_indices(model, sp.y_train)


def prepare_learning_project(model_dir: ModelDir, model, board: Board) -> Path:
    """DIR/learning/: the model's sources (rendered from model.json with today's runtime) + the learning flags."""
    return write_learning_project(model_dir.path / LEARNING_DIR, model, board, *model_dir.header_args())


# ---------------------------------------------------------------------------------------------------- outputs


def write_learned_dir(model_dir: ModelDir, learned, summary: dict) -> Path:
    """DIR/learned/: a model directory (model.json with the learned counts, reference test vectors, sources,
    platformio.ini, report.json) that `tinyproto build` / `validate` treat like any other."""
    from tinyproto.core.render import model_hash
    from tinyproto.pipeline.compile import write_model_files

    parent = model_dir.vectors()
    scores = learned.scores(parent.xq)
    labels = learned.labels(scores).astype(np.int64)
    # the learned counts keep the compiled model's calibration and threshold: its answers are recomputed
    confidence, decided = families.judge(learned, scores, labels, parent.xq)
    vectors = TestVectors(parent.X_raw, parent.xq, parent.y, scores.astype(np.int64), labels,
                          confidence.astype(np.int64), decided.astype(np.int64))
    board = load_board(model_dir.board)
    digest = f"0x{model_hash(learned):08X}"
    meta = dict(model_dir.meta, model_hash=digest, int_model=learned.to_json(),
                int_model_sha256=int_model_digest(learned.to_json()),
                learned_on_device={k: summary[k] for k in ("target", "data", "n_samples", "counts_identical")})
    report = dict(model_dir.report, model_hash=digest, int8_accuracy=float(np.mean(vectors.labels == vectors.y)),
                  learned_on_device=meta["learned_on_device"])
    out = model_dir.path / LEARNED_DIR
    with atomic_directory(out, "learn") as scratch:
        write_model_files(scratch, learned, meta, report, vectors, board)
    return out


def build_learned_dir(path: Path) -> dict:
    """The learned model's normal firmware (build.json included), so `tinyproto validate` runs right away."""
    from rich.console import Console

    from tinyproto.pipeline.firmware import build_model_dir

    return build_model_dir(path, None, Console(quiet=True))


# ---------------------------------------------------------------------------------------------------- the flow


@dataclass(frozen=True)
class LearnOptions:
    """What `tinyproto learn` takes beside the model directory, each with the command's default.

    data: the rows to learn (default the model's own data set); label: the CSV's label column. port: a real
    board (None: the simulated one); upload_port: where avrdude writes when it is not port (the Leonardo's own
    USB port); baud: the line's speed (default the board's serial_baud), built into the learning firmware.
    save_eeprom: keep the learned counts in EEPROM; flash: upload the learning firmware first (a real board
    that already runs it: False); build_learned: build the learned model's firmware afterwards."""

    data: str | None = None
    port: str | None = None
    upload_port: str | None = None
    baud: int | None = None
    label: str | None = None
    save_eeprom: bool = False
    flash: bool = True
    build_learned: bool = True


def learn_on_device(path: Path, options: LearnOptions | None = None,
                    progress_factory: ProgressFactory | None = None, say: Callable[[str], None] | None = None) -> dict:
    """Learn DATA's training split on the device (simulated when options.port is None); returns learn.json's
    content."""
    o = options or LearnOptions()
    model_dir = load_model_dir(path)
    with locked(model_dir.path, "learn"):
        _check_learned_replaceable(model_dir.path / LEARNED_DIR)  # first: it names the user's files in learned/
        record_outputs(model_dir.path, LEARNING_DIR, LEARNED_DIR, "learn.json")
        return _learn_locked(model_dir, o.data, o.port, o.save_eeprom, o.label, o.flash, o.build_learned,
                             progress_factory, say, o.upload_port, o.baud)


def _check_learned_replaceable(learned: Path) -> None:
    """Refuse now, before the device learns (not after it, when the learned model is written), a learned/ that holds
    what tinyproto did not write; in learn's own words (atomic_directory's would speak of an --out learn has not)."""
    from tinyproto.core.manifest import foreign_entries, read_manifest

    if not learned.is_dir() or learned.is_symlink() or not any(learned.iterdir()):
        return  # missing (made by this run); a link or a file was refused by record_outputs
    foreign = foreign_entries(learned)
    if foreign:
        what = ("was not written by tinyproto" if read_manifest(learned) is None else
                "holds files tinyproto did not write")
        raise TinyprotoError(f"{learned}, where learn writes the learned model, {what} ({', '.join(foreign)}); "
                             "move it away, nothing was changed")


def _learn_locked(model_dir: ModelDir, data: str | None, port: str | None, save_eeprom: bool, label: str | None,
                  flash: bool, build_learned: bool, progress_factory: ProgressFactory | None,
                  say: Callable[[str], None] | None, upload_port: str | None, baud: int | None = None) -> dict:
    from tinyproto.device.flash import flash_port, upload_target
    from tinyproto.device.port_checks import check_port_usable
    from tinyproto.pipeline.validate import checked_vectors

    started = time.monotonic()
    say = say or (lambda message: None)
    model = families.load_int_model(model_dir)
    board = load_board(model_dir.board).with_baud(baud)
    sizes = require_learnable(model, board, save_eeprom)  # before anything is built
    upload_port = upload_target(board, port, upload_port)
    for usable in dict.fromkeys(x for x in (port, upload_port if flash else None) if x is not None):
        check_port_usable(usable)  # now, not after the learning firmware's build
    if port is None:
        from tinyproto.device.sim import check_image_file

        check_image_file(model_dir.path / LEARNING_DIR / EEPROM_IMAGE)  # likewise
    data = data or _default_data(model_dir)
    data_name, xq, y_index = training_samples(model, data, label)
    learning = families.family_of(model).learning
    expected = learning.host_counts(model, xq, y_index)
    vectors = checked_vectors(model_dir, model)  # before the build: a damaged file left learning/ built, then refused
    firmware = build_learning_firmware(prepare_learning_project(model_dir, model, board), model, board, sizes, say)
    if port is not None and flash:
        say(f"flashing {upload_port} with the learning firmware")
        flash_port(board, upload_port, firmware.hex)
    image = firmware.project / EEPROM_IMAGE if port is None else None
    target = Target(port, image, board.boot_quiet_s)

    def tick(what: str, total: int) -> Callable[[int], None] | None:
        return progress_factory(what, total) if progress_factory else None

    with ExitStack() as stack:
        client = target.open(stack, firmware.elf, board.serial_baud)
        if port is not None and not flash and not client.info.learning:  # the hint of CANNOT_LEARN is this run
            raise TinyprotoError(f"the board on {port} runs a firmware that cannot learn, not this model's learning "
                                 "firmware: run learn without --no-flash, which builds and flashes it")
        check_learning_device(client.info, model_dir.model_hash, model.n_features, model.n_classes)
        if save_eeprom and not client.info.eeprom:
            raise TinyprotoError("the learning firmware has no EEPROM support: its counts do not fit the EEPROM")
        cycles = stream_samples(client, xq, y_index, tick("learning", len(xq)))
        packed = client.read_all_counts(tick("reading counts", sizes.counts))
        learned_counts = learning.unpack_counts(packed, model)
        learned = replace(model, counts=learned_counts)
        test = predict_vectors(client, learned, vectors, tick("test vectors", len(vectors.y)))
        saved = client.eeprom_save() if save_eeprom else None
        stats = client.stats()

    eeprom = {"saved": saved is not None, "eeprom_bytes": board.eeprom_bytes, "record_bytes": sizes.eeprom_record}
    if saved is not None:
        eeprom.update(bytes_written=saved.written, record_bytes=saved.record,
                      reloaded_identical=_reload_matches(target, firmware.elf, board, packed))
    identical = bool(np.array_equal(learned_counts, expected))
    # what the device reports is checked before it is scaled or added (core/measured.py): a figure that is not a
    # measurement is left out (null) and named in device_figure_problems, which makes learn exit non-zero
    cycles_bad = cycle_problem(cycles)
    stack_bad = stack_problem(stats.stack_peak, stats.static_sram, firmware.sram_static_bytes, board.sram_bytes)
    problems = [p for p in (cycles_bad, stack_bad) if p]
    cycles_ok = bool(cycles) and cycles_bad is None
    stack = stats.stack_peak if stack_bad is None else None
    used = firmware.sram_static_bytes + stack if stack is not None else None
    summary = {
        "target": target.name,
        "data": data_name,
        "n_samples": int(len(xq)),
        "counts_identical": identical,
        "count_entries_differing": int(np.count_nonzero(learned_counts != expected)),
        "counts_equal_compiled_model": bool(np.array_equal(learned_counts, model.counts)),
        "host_reference": learning.host_reference(model),
        "count_bytes": sizes.counts,
        "learn_cycles_mean": float(np.mean(cycles)) if cycles_ok else None,
        "learn_ms_mean": 1000.0 * float(np.mean(cycles)) / board.f_cpu_hz if cycles_ok else None,
        "device_figure_problems": problems,
        "test": dict(test, compiled_model_accuracy=model_dir.report.get("int8_accuracy")),
        "sram": dict(sizes.to_dict(), static_bytes=firmware.sram_static_bytes, stack_peak_bytes=stack,
                     used_bytes=used, margin_bytes=board.sram_bytes - used if used is not None else None),
        "eeprom": eeprom,
        "firmware": {"project": LEARNING_DIR, "elf": str(firmware.elf.relative_to(model_dir.path.resolve())),
                     "flash_bytes": firmware.flash_bytes, "tool": firmware.tool, "flags": list(LEARN_FLAGS)},
    }
    learned_dir = write_learned_dir(model_dir, learned, summary)
    summary["learned_model_dir"] = LEARNED_DIR
    summary["learned_model_hash"] = json.loads((learned_dir / "model.json").read_text(encoding="utf-8"))["model_hash"]
    if build_learned:
        say(f"building the learned model's firmware in {learned_dir}")
        build_learned_dir(learned_dir)
    summary["seconds"] = round(time.monotonic() - started, 2)
    write_json(model_dir.path / "learn.json", summary)
    return summary


def _default_data(model_dir: ModelDir) -> str:
    from tinyproto.core.datasets import BUILTIN

    name = model_dir.header_args()[0]  # load_model_dir refused a model.json without its dataset
    if name in BUILTIN:
        return name
    raise TinyprotoError(f"say which data to learn: --data FILE (the model was compiled on {name!r})")


def _reload_matches(target: Target, elf: Path, board: Board, packed: bytes) -> bool:
    """Power-cycle the device (restart the simulator on its EEPROM image, or reopen the port, which resets an
    Uno), EEPROM_LOAD, and compare the counts with what was saved."""
    with ExitStack() as stack:
        client = target.open(stack, elf, board.serial_baud)
        loaded = client.eeprom_load()
        if not loaded.loaded:
            raise TinyprotoError(f"after the restart the device found no valid EEPROM record (status {loaded.status})")
        return client.read_all_counts() == packed


__all__ = ["learn_on_device", "require_learnable"]
