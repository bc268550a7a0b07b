"""The learning firmware and the dialogue with a device that learns: shared by `tinyproto learn` (one device,
pipeline/learn.py) and by the federated parties that learn on a device (device_parties.py, one per party).

Layer: federated (below pipeline, so both can import it). The learning firmware is the model's normal firmware
built with LEARN_FLAGS (the counts move to SRAM, LEARN / READ_COUNTS / CLEAR / EEPROM_SAVE / EEPROM_LOAD are
answered); its sizes are FlyNN's (families/flynn/learning.py). The dialogue: check the handshake (this very
model, learning firmware), CLEAR, LEARN every int8 sample with its class index, read the counts back.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyproto.core.boards import Board
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.labels import encode
from tinyproto.core.modeldir import TestVectors
from tinyproto.core.safe_io import write_json
from tinyproto.core.render import write_sources
from tinyproto.device.build import build_project, render_platformio_ini
from tinyproto.device.protocol import CANNOT_LEARN, check_model, open_device
from tinyproto.device.sim import SimulatedUno
from tinyproto.families.flynn.learning import LearnSizes, layout_key

LEARN_FLAGS = ("-DTP_FLYNN_LEARN", "-DTP_NO_RAW_INPUT")  # PREDICT_RAW's float buffer would cost 4 B per feature
HANDSHAKE_S = 5.0


def class_indices(model, y: np.ndarray) -> np.ndarray:
    """Original labels -> the model's class indices (the one label coding); unknown labels are an error."""
    return encode(y, list(model.classes), "the data")


def learning_ini(board: Board, key: int) -> str:
    """platformio.ini of the learning firmware: the model's, with the learning switches in every environment."""
    text = render_platformio_ini(board)
    marker = "\nbuild_flags = -std=gnu99"
    if text.count(marker) != 1:
        raise AssertionError("templates/platformio.ini.j2 no longer has one common build_flags line")
    flags = " ".join((*LEARN_FLAGS, f"-DTP_FLYNN_LAYOUT_KEY=0x{key:08X}UL"))
    head, tail = text.split(marker)
    line_end = tail.index("\n")
    return head + marker + tail[:line_end] + " " + flags + tail[line_end:]


def write_learning_project(project: Path, model, board: Board, dataset: str, seed: int, budget_bytes: int) -> Path:
    """A learning-firmware project for `model` in `project` (also used without a model directory, by the
    federated device parties, whose model has no counts yet)."""
    for sub in ("include", "lib", "src"):
        shutil.rmtree(project / sub, ignore_errors=True)  # no stale runtime file survives
    project.mkdir(parents=True, exist_ok=True)
    write_sources(model, project, dataset, seed, budget_bytes, rx_ring=0)  # answers one request at a time
    (project / "platformio.ini").write_text(learning_ini(board, layout_key(model)), encoding="utf-8")
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
    """Build a prepared learning project (`write_learning_project`) and check its static SRAM
    (counts + buffers) against the plan and the board."""
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
        if self.port is None:
            uno = stack.enter_context(SimulatedUno(elf, markers=False, eeprom=self.eeprom_image))
            return stack.enter_context(open_device(uno.port, baud=baud, handshake_timeout=HANDSHAKE_S))
        return stack.enter_context(open_device(self.port, baud=baud, handshake_timeout=HANDSHAKE_S,
                                               boot_quiet_s=self.boot_quiet_s))


def check_learning_device(hello, model_hash: int, n_features: int, n_classes: int) -> None:
    """The device must run the learning firmware of this very model."""
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


__all__ = ["HANDSHAKE_S", "LEARN_FLAGS", "LearningFirmware", "Target", "build_learning_firmware",
           "check_learning_device", "class_indices", "learning_ini", "predict_vectors", "stream_samples",
           "write_learning_project"]
