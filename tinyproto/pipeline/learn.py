"""`tinyproto learn`: FlyNN learns on the device, and the host proves it learned exactly what the host would.

FlyNN's training is one pass of counting (t_lj = how many samples of class l set hash bit j, saturated to b bits),
so the microcontroller can do it itself. The learning firmware is the model's normal firmware built with
`TP_FLY_LEARN` (firmware/tp_flynn.c, firmware/tp_main.c): the packed counts move from flash to SRAM (seeded from
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
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tinyproto import families
from tinyproto.core import wire
from tinyproto.core.boards import Board, load_board
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.modeldir import ModelDir, TestVectors, file_sha256, int_model_digest, load_model_dir, record_outputs, write_json
from tinyproto.core.outdir import atomic_directory, locked

LEARN_FLAGS = ("-DTP_FLY_LEARN", "-DTP_NO_RAW_INPUT")  # PREDICT_RAW's float buffer would cost 4 B per feature
EEPROM_HEADER_BYTES = wire.EEPROM_HEADER_BYTES  # the record's header (firmware/tp_learn.c, tinyproto_sizes.h)
# .bss of the learning app besides the counts, the frame buffer and the input vector (checked against avr-size
# in tests/test_learn.py).
APP_STATIC_BYTES = wire.app_sram(1, 1, streamable=False, raw_input=False, learning=True).app
LEARNING_DIR = "learning"  # the learning firmware's project, inside the model directory
LEARNED_DIR = "learned"  # the learned model, a model directory of its own
EEPROM_IMAGE = "eeprom.bin"  # the simulated Uno's EEPROM, kept across runs in LEARNING_DIR
HANDSHAKE_S = 5.0

ProgressFactory = Callable[[str, int], Callable[[int], None]]


# ---------------------------------------------------------------------------------------------------- sizes


def count_bytes(n_hashes: int, n_classes: int, bits: int) -> int:
    """Bytes of the packed counts: L x m entries of b bits (the layout of tp_fly_filters)."""
    return math.ceil(n_hashes * n_classes * bits / 8)


def learn_frame_bytes(n_features: int, n_classes: int) -> int:
    """The learning firmware's frame buffer (TP_FRAME_BUF_NO_RAW) + the int8 input vector its LEARN and PREDICT
    chunks are gathered in (FlyNN does not stream)."""
    sizes = wire.app_sram(n_features, n_classes, streamable=False, raw_input=False, learning=True)
    return sizes.frame + sizes.input


def fly_working_bytes(n_winners: int, n_hash_inputs: int, n_classes: int, store_M: bool) -> int:
    """Σ IntFlyNN.working_sram() for these sizes (the solver needs it before a model exists)."""
    return 4 * n_winners + n_hash_inputs + 2 * n_classes + (0 if store_M else n_hash_inputs)


@dataclass(frozen=True)
class LearnSizes:
    """What the learning firmware needs in SRAM and, to persist, in EEPROM; every figure in bytes."""

    n_hashes: int
    n_classes: int
    bits: int
    counts: int
    frame: int
    app_static: int
    working: int
    reserve: int
    sram_total: int
    sram_board: int
    eeprom_record: int
    eeprom_board: int
    largest_m_sram: int  # at these ρ, b, inputs
    largest_m_eeprom: int

    @property
    def fits_sram(self) -> bool:
        return self.sram_total <= self.sram_board

    @property
    def fits_eeprom(self) -> bool:
        return self.eeprom_record <= self.eeprom_board

    def to_dict(self) -> dict:
        return {
            "count_bytes": self.counts,
            "counts": f"{self.n_classes} classes x {self.n_hashes} hash bits x {self.bits} bit(s)",
            "frame_buffer_bytes": self.frame,
            "app_static_bytes": self.app_static,
            "inference_stack_bytes": self.working,
            "reserved_bytes": self.reserve,
            "sram_estimate_bytes": self.sram_total,
            "board_sram_bytes": self.sram_board,
            "eeprom_record_bytes": self.eeprom_record,
            "board_eeprom_bytes": self.eeprom_board,
            "largest_m_sram": self.largest_m_sram,
            "largest_m_eeprom": self.largest_m_eeprom,
        }


def _sram_for_counts(board: Board, n_features: int, n_classes: int, working: int) -> int:
    """SRAM left for the counts once the frame buffer, the app's state, the stack and the reserve are taken."""
    return (board.sram_bytes - board.sram_reserved_bytes - learn_frame_bytes(n_features, n_classes)
            - APP_STATIC_BYTES - working)


def _largest_m(free_bytes: int, n_classes: int, bits: int) -> int:
    return max(0, min(65535, 8 * free_bytes // (n_classes * bits))) if free_bytes > 0 else 0


def count_limit(board: Board, n_features: int, n_classes: int) -> Callable[[int, int, int, bool], int]:
    """For the FlyNN solver (`compile --learnable`): (ρ, b, hash inputs, stored M) -> the largest m whose counts
    fit both the SRAM (beside everything else the learning firmware needs) and the EEPROM record."""

    def limit(rho: int, bits: int, n_inputs: int, store_M: bool) -> int:
        working = fly_working_bytes(rho, n_inputs, n_classes, store_M)
        sram_m = _largest_m(_sram_for_counts(board, n_features, n_classes, working), n_classes, bits)
        eeprom_m = _largest_m(board.eeprom_bytes - EEPROM_HEADER_BYTES, n_classes, bits)
        return min(sram_m, eeprom_m)

    return limit


def learn_sizes(model, board: Board) -> LearnSizes:
    """The learning firmware's SRAM and EEPROM needs for this FlyNN on this board."""
    m, L, b = model.n_hashes, model.n_classes, model.bits
    working = sum(item.nbytes for item in model.working_sram())
    counts = count_bytes(m, L, b)
    frame = learn_frame_bytes(model.n_features, L)
    total = counts + frame + APP_STATIC_BYTES + working + board.sram_reserved_bytes
    return LearnSizes(
        n_hashes=m, n_classes=L, bits=b, counts=counts, frame=frame, app_static=APP_STATIC_BYTES, working=working,
        reserve=board.sram_reserved_bytes, sram_total=total, sram_board=board.sram_bytes,
        eeprom_record=EEPROM_HEADER_BYTES + counts, eeprom_board=board.eeprom_bytes,
        largest_m_sram=_largest_m(_sram_for_counts(board, model.n_features, L, working), L, b),
        largest_m_eeprom=_largest_m(board.eeprom_bytes - EEPROM_HEADER_BYTES, L, b),
    )  # fmt: skip


def check_learnable(model, board: Board, save_eeprom: bool) -> LearnSizes:
    """Refuse, before any build, a model whose counts the device cannot hold; the error says what would fit."""
    if not families.family_of(model).learnable:
        raise TinyprotoError(
            f"only FlyNN learns on the device (this model is {getattr(model, 'family', '?')}); compile with "
            "--model flynn --learnable"
        )
    sizes = learn_sizes(model, board)
    over = []
    if not sizes.fits_sram:
        over.append(
            f"SRAM needs {sizes.sram_total} B > {sizes.sram_board} B (counts {sizes.counts} + frame buffer "
            f"{sizes.frame} + app {sizes.app_static} + inference stack {sizes.working} + reserve {sizes.reserve})"
        )
    if save_eeprom and not sizes.fits_eeprom:
        over.append(f"the EEPROM record needs {sizes.eeprom_record} B > {sizes.eeprom_board} B")
    if over:
        fit = min(sizes.largest_m_sram, sizes.largest_m_eeprom) if save_eeprom else sizes.largest_m_sram
        one_bit = f" ({fit * sizes.bits} with 1-bit counts)" if sizes.bits > 1 else ""
        also = ""
        if fit > sizes.largest_m_eeprom:
            also = f" (which also keeps them within the EEPROM for --save-eeprom: m <= {sizes.largest_m_eeprom})"
        raise TinyprotoError(
            f"the counts do not fit the device: {sizes.n_classes} classes x m={sizes.n_hashes} x "
            f"{sizes.bits} bit(s) = {sizes.counts} B; {'; '.join(over)}. At most m={fit} fits with "
            f"{sizes.bits}-bit counts{one_bit}: recompile with `tinyproto compile DATA --model flynn --budget ... "
            f"--learnable`{also}"
        )
    return sizes


# ---------------------------------------------------------------------------------------------------- host side


def layout_key(model) -> int:
    """32-bit identity of the model without its counts (M, sizes, input stage): the EEPROM record carries it so
    the firmware never loads counts saved by another model."""
    from tinyproto.core.render import model_hash

    blank = replace(model, counts=np.zeros_like(model.counts))
    digest = hashlib.sha256(f"learn-layout:{model_hash(blank):08x}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def host_counts(model, xq: np.ndarray, y_index: np.ndarray) -> np.ndarray:
    """(L, m) counts the device must end with after learning (xq, y) from zero: the integer reference's winners,
    counted, saturated to the model's bits (the same computation as IntFlyNN.from_classifier)."""
    from tinyproto.families.flynn.train import count_winners

    counts = count_winners(model.winners(xq), np.asarray(y_index), model.n_classes, model.n_hashes)
    return np.minimum(counts, (1 << model.bits) - 1)


def unpack_counts(packed: bytes, model) -> np.ndarray:
    """Device bytes -> (L, m) counts (the packing is (j, l) order, LSB first, like tp_fly_filters)."""
    from tinyproto.families.flynn.quantize import unpack_bits

    m, L = model.n_hashes, model.n_classes
    values = unpack_bits(np.frombuffer(packed, dtype=np.uint8), model.bits, m * L)
    return values.reshape(m, L).T.copy()


def class_indices(model, y: np.ndarray) -> np.ndarray:
    """Original labels -> the model's class indices; labels the model does not know are an error."""
    index = {c: i for i, c in enumerate(model.classes)}
    plain = [v.item() if hasattr(v, "item") else v for v in np.asarray(y)]
    unknown = sorted({repr(v) for v in plain if v not in index})
    if unknown:
        raise TinyprotoError(
            f"the data has labels the model does not know: {', '.join(unknown[:5])} (model classes: "
            f"{', '.join(map(repr, model.classes))})"
        )
    return np.array([index[v] for v in plain], dtype=np.int64)


def training_samples(model, data: str, label: str | None) -> tuple[str, np.ndarray, np.ndarray]:
    """(data name, int8 training vectors, class indices): DATA's training split through the model's input stage."""
    from tinyproto.core.datasets import load_dataset, split

    dataset = load_dataset(data, label=label)
    if dataset.X.shape[1] != model.n_features:
        raise TinyprotoError(
            f"{dataset.name} has {dataset.X.shape[1]} features, the model {model.n_features}"
        )
    sp = split(dataset)
    return dataset.name, model.input_stage.quantize(sp.X_train), class_indices(model, sp.y_train)


# ---------------------------------------------------------------------------------------------------- firmware


def learning_ini(board: Board, key: int) -> str:
    """platformio.ini of the learning firmware: the model's, with the learning switches in every environment."""
    from tinyproto.device.build import render_platformio_ini

    text = render_platformio_ini(board)
    marker = "\nbuild_flags = -std=gnu99"
    if text.count(marker) != 1:
        raise AssertionError("templates/platformio.ini.j2 no longer has one common build_flags line")
    flags = " ".join((*LEARN_FLAGS, f"-DTP_FLY_LAYOUT_KEY=0x{key:08X}UL"))
    head, tail = text.split(marker)
    line_end = tail.index("\n")
    return head + marker + tail[:line_end] + " " + flags + tail[line_end:]


def prepare_learning_project(model_dir: ModelDir, model, board: Board) -> Path:
    """DIR/learning/: the model's sources (rendered from model.json with today's runtime) + the learning flags."""
    meta = model_dir.meta
    return write_learning_project(model_dir.path / LEARNING_DIR, model, board, meta.get("dataset", "?"),
                                  int(meta.get("seed", 0)), int(meta["budget_bytes"]))


def write_learning_project(project: Path, model, board: Board, dataset: str, seed: int, budget_bytes: int) -> Path:
    """A learning-firmware project for `model` in `project` (also used without a model directory, by the
    federated device parties, whose model has no counts yet)."""
    from tinyproto.core.render import write_sources

    for sub in ("include", "lib", "src"):
        shutil.rmtree(project / sub, ignore_errors=True)  # no stale runtime file survives
    project.mkdir(parents=True, exist_ok=True)
    write_sources(model, project, dataset, seed, budget_bytes)
    (project / "platformio.ini").write_text(learning_ini(board, layout_key(model)))
    return project


@dataclass(frozen=True)
class LearningFirmware:
    project: Path
    elf: Path
    hex: Path
    flash_bytes: int
    sram_static_bytes: int
    tool: str


def build_learning_firmware(project: Path, model, board: Board, sizes: LearnSizes,
                            say: Callable[[str], None]) -> LearningFirmware:
    """Build a prepared learning project (DIR/learning/, `prepare_learning_project`) and check its static SRAM
    (counts + buffers) against the plan and the board."""
    from tinyproto.device.build import build_project

    project = Path(project).resolve()
    result = build_project(project, progress=say)
    static = result.sizes.sram_static_bytes
    if result.sizes.flash_bytes > board.flash_bytes_for_sketch:
        raise TinyprotoError(f"the learning firmware needs {result.sizes.flash_bytes} B of flash; "
                             f"{board.title} has {board.flash_bytes_for_sketch} B")
    if static + sizes.working + sizes.reserve > board.sram_bytes:
        raise TinyprotoError(
            f"the learning firmware's static SRAM ({static} B, counts {sizes.counts} B included) leaves less than "
            f"{sizes.working + sizes.reserve} B of {board.sram_bytes} B for the inference stack and the reserve"
        )
    firmware = LearningFirmware(project, result.elf, result.hex, result.sizes.flash_bytes, static, result.tool)
    write_json(project / "build.json", {
        "env": f"{board.name}_sim", "tool": result.tool, "elf": str(result.elf.relative_to(project)),
        "hex": str(result.hex.relative_to(project)), "flash_bytes": result.sizes.flash_bytes,
        "sram_static_bytes": static, "flags": list(LEARN_FLAGS), "layout_key": f"0x{layout_key(model):08X}",
    })  # fmt: skip
    return firmware


# ---------------------------------------------------------------------------------------------------- device


@dataclass
class Target:
    """Where the learning firmware runs: the simulated Uno (EEPROM kept in a file) or a real board's port."""

    port: str | None
    eeprom_image: Path | None  # simulator only
    boot_quiet_s: float = 0.0  # a real board's: silence after opening its port (Board.boot_quiet_s)

    @property
    def name(self) -> str:
        return self.port or "sim"

    def open(self, stack: ExitStack, elf: Path, baud: int):
        """A connected client after the handshake; a fresh start each time (simulator started / board reset)."""
        from tinyproto.device.protocol import open_device
        from tinyproto.device.sim import SimulatedUno

        if self.port is None:
            uno = stack.enter_context(SimulatedUno(elf, markers=False, eeprom=self.eeprom_image))
            return stack.enter_context(open_device(uno.port, baud=baud, handshake_timeout=HANDSHAKE_S))
        return stack.enter_context(open_device(self.port, baud=baud, handshake_timeout=HANDSHAKE_S,
                                               boot_quiet_s=self.boot_quiet_s))


def check_learning_device(hello, model_hash: int, n_features: int, n_classes: int) -> None:
    """The device must run the learning firmware of this very model."""
    from tinyproto.device.protocol import CANNOT_LEARN, check_model

    check_model(hello, model_hash, n_features, n_classes)
    if not hello.learning:
        raise TinyprotoError(CANNOT_LEARN)


def stream_samples(client, xq: np.ndarray, y_index: np.ndarray, tick: Callable[[int], None] | None) -> list[int]:
    """CLEAR, then LEARN every sample in order; returns the device's cycles per learning step."""
    client.clear()
    cycles = []
    for i in range(len(xq)):
        ack = client.learn(xq[i], int(y_index[i]))
        if ack.n_samples != i + 1:
            raise TinyprotoError(f"the device counted {ack.n_samples} samples after the {i + 1}th LEARN")
        cycles.append(ack.cycles)
        if tick:
            tick(1)
    return cycles


def predict_vectors(client, model, vectors: TestVectors, tick: Callable[[int], None] | None) -> dict:
    """Every test vector on the learned SRAM counts, compared with the learned model's integer reference."""
    scores = model.scores(vectors.xq)
    labels = model.labels(scores)
    same_scores = same_labels = correct = 0
    for i in range(len(vectors.xq)):
        answer = client.predict(vectors.xq[i])
        same_scores += [int(s) for s in answer.scores] == [int(s) for s in scores[i]]
        same_labels += int(answer.label) == int(labels[i])
        correct += int(answer.label) == int(vectors.y[i])
        if tick:
            tick(1)
    n = len(vectors.xq)
    return {
        "n_vectors": n,
        "score_agreement": same_scores / n if n else 0.0,
        "label_agreement": same_labels / n if n else 0.0,
        "device_accuracy": correct / n if n else 0.0,
        "host_accuracy": float(np.mean(labels == vectors.y)) if n else 0.0,
    }


# ---------------------------------------------------------------------------------------------------- outputs


def write_learned_dir(model_dir: ModelDir, learned, summary: dict) -> Path:
    """DIR/learned/: a model directory (model.json with the learned counts, reference test vectors, sources,
    platformio.ini, report.json) that `tinyproto build` / `validate` treat like any other."""
    from tinyproto.device.build import render_pio_test, render_platformio_ini
    from tinyproto.core.render import model_hash, write_sources

    parent = model_dir.vectors()
    scores = learned.scores(parent.xq)
    vectors = TestVectors(parent.X_raw, parent.xq, parent.y, scores.astype(np.int64),
                          learned.labels(scores).astype(np.int64))
    board = load_board(model_dir.meta.get("board", "uno"))
    digest = f"0x{model_hash(learned):08X}"
    meta = dict(model_dir.meta, model_hash=digest, int_model=learned.to_json(),
                int_model_sha256=int_model_digest(learned.to_json()),
                learned_on_device={k: summary[k] for k in ("target", "data", "n_samples", "counts_identical")})
    report = dict(model_dir.report, model_hash=digest, int8_accuracy=float(np.mean(vectors.labels == vectors.y)),
                  learned_on_device=meta["learned_on_device"])
    out = model_dir.path / LEARNED_DIR
    with atomic_directory(out, "learn") as scratch:
        vectors.save(scratch / "test_vectors.npz")
        meta["vectors_sha256"] = file_sha256(scratch / "test_vectors.npz")
        write_json(scratch / "model.json", meta)
        write_sources(learned, scratch, meta.get("dataset", "?"), int(meta.get("seed", 0)), int(meta["budget_bytes"]))
        (scratch / "platformio.ini").write_text(render_platformio_ini(board))
        n = min(8, len(vectors.labels))
        if n:
            render_pio_test(scratch, vectors.xq[:n], vectors.scores[:n], vectors.labels[:n])
        write_json(scratch / "report.json", report)
    return out


def build_learned_dir(path: Path) -> dict:
    """The learned model's normal firmware (build.json included), so `tinyproto validate` runs right away."""
    from rich.console import Console

    from tinyproto.pipeline.firmware import build_model_dir

    return build_model_dir(path, None, Console(quiet=True))


# ---------------------------------------------------------------------------------------------------- the flow


def learn_on_device(
    path: Path,
    data: str | None = None,
    port: str | None = None,
    save_eeprom: bool = False,
    label: str | None = None,
    flash: bool = True,
    build_learned: bool = True,
    progress_factory: ProgressFactory | None = None,
    say: Callable[[str], None] | None = None,
) -> dict:
    """Learn DATA's training split on the device (simulated when port is None); returns learn.json's content."""
    model_dir = load_model_dir(path)
    with locked(model_dir.path, "learn"):
        record_outputs(model_dir.path, LEARNING_DIR, LEARNED_DIR, "learn.json")
        return _learn_locked(model_dir, data, port, save_eeprom, label, flash, build_learned, progress_factory, say)


def _learn_locked(model_dir: ModelDir, data: str | None, port: str | None, save_eeprom: bool, label: str | None,
                  flash: bool, build_learned: bool, progress_factory: ProgressFactory | None,
                  say: Callable[[str], None] | None) -> dict:
    from tinyproto.pipeline.validate import checked_vectors

    started = time.monotonic()
    say = say or (lambda message: None)
    model = families.load_int_model(model_dir)
    board = load_board(model_dir.meta.get("board", "uno"))
    sizes = check_learnable(model, board, save_eeprom)  # before anything is built
    data = data or _default_data(model_dir)
    data_name, xq, y_index = training_samples(model, data, label)
    expected = host_counts(model, xq, y_index)
    firmware = build_learning_firmware(prepare_learning_project(model_dir, model, board), model, board, sizes, say)
    if port is not None and flash:
        from tinyproto.device.flash import flash_port

        say(f"flashing {port} with the learning firmware")
        flash_port(board, port, firmware.hex)
    image = firmware.project / EEPROM_IMAGE if port is None else None
    target = Target(port, image, board.boot_quiet_s)

    def tick(what: str, total: int) -> Callable[[int], None] | None:
        return progress_factory(what, total) if progress_factory else None

    vectors = checked_vectors(model_dir, model)
    with ExitStack() as stack:
        client = target.open(stack, firmware.elf, board.serial_baud)
        check_learning_device(client.info, model_dir.model_hash, model.n_features, model.n_classes)
        if save_eeprom and not client.info.eeprom:
            raise TinyprotoError("the learning firmware has no EEPROM support: its counts do not fit the EEPROM")
        cycles = stream_samples(client, xq, y_index, tick("learning", len(xq)))
        packed = client.read_all_counts(tick("reading counts", sizes.counts))
        learned_counts = unpack_counts(packed, model)
        learned = replace(model, counts=learned_counts)
        test = predict_vectors(client, learned, vectors, tick("test vectors", len(vectors.y)))
        saved = client.eeprom_save() if save_eeprom else None
        stats = client.stats()

    eeprom = {"saved": saved is not None, "eeprom_bytes": board.eeprom_bytes, "record_bytes": sizes.eeprom_record}
    if saved is not None:
        eeprom.update(bytes_written=saved.written, record_bytes=saved.record,
                      reloaded_identical=_reload_matches(target, firmware.elf, board, packed))
    identical = bool(np.array_equal(learned_counts, expected))
    used = firmware.sram_static_bytes + stats.stack_peak
    summary = {
        "target": target.name,
        "data": data_name,
        "n_samples": int(len(xq)),
        "counts_identical": identical,
        "count_entries_differing": int(np.count_nonzero(learned_counts != expected)),
        "counts_equal_compiled_model": bool(np.array_equal(learned_counts, model.counts)),
        "host_reference": "IntFlyNN FlyHash of the same int8 vectors, counts saturated to "
                          f"{model.bits} bit(s)",
        "count_bytes": sizes.counts,
        "learn_cycles_mean": float(np.mean(cycles)) if cycles else 0.0,
        "learn_ms_mean": 1000.0 * float(np.mean(cycles)) / board.f_cpu_hz if cycles else 0.0,
        "test": dict(test, compiled_model_accuracy=model_dir.report.get("int8_accuracy")),
        "sram": dict(sizes.to_dict(), static_bytes=firmware.sram_static_bytes, stack_peak_bytes=stats.stack_peak,
                     used_bytes=used, margin_bytes=board.sram_bytes - used),
        "eeprom": eeprom,
        "firmware": {"project": LEARNING_DIR, "elf": str(firmware.elf.relative_to(model_dir.path.resolve())),
                     "flash_bytes": firmware.flash_bytes, "tool": firmware.tool, "flags": list(LEARN_FLAGS)},
    }
    learned_dir = write_learned_dir(model_dir, learned, summary)
    summary["learned_model_dir"] = LEARNED_DIR
    summary["learned_model_hash"] = json.loads((learned_dir / "model.json").read_text())["model_hash"]
    if build_learned:
        say(f"building the learned model's firmware in {learned_dir}")
        build_learned_dir(learned_dir)
    summary["seconds"] = round(time.monotonic() - started, 2)
    write_json(model_dir.path / "learn.json", summary)
    return summary


def _default_data(model_dir: ModelDir) -> str:
    from tinyproto.core.datasets import BUILTIN

    name = model_dir.meta.get("dataset")
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


__all__ = ["learn_on_device", "check_learnable", "learn_sizes", "count_limit", "host_counts", "LearnSizes"]
