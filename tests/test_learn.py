"""FlyNN learns on the device (tinyproto learn): the learning firmware's counts equal the host's, predictions on
them validate bit-exactly, EEPROM persistence survives a restart, what does not fit is refused before any build,
and firmware that cannot learn says so. The learning app also runs host-compiled (gcc) for the fast checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tinyproto.core.boards import load_board
from tinyproto.families.flynn import learning as FL
from tinyproto.federated import device_learning as DL
from tinyproto.pipeline import learn as L
from tinyproto.device import protocol as P
from tinyproto.core.errors import TinyprotoError
from tinyproto import families

from helpers import PipePort, fresh_copy, needs
from helpers import refused, tinyproto

HAVE_SIM = os.path.exists("/usr/include/simavr/sim_avr.h")
BOARD = load_board("uno")


def cli(*args, cwd=None):
    return tinyproto(*args, timeout=300, cwd=cwd)


def flynn_dir(out: Path, bits: int, m: int, s: int = 8, rho: int = 16, board=BOARD) -> Path:
    """A FlyNN model directory with chosen shapes (bits > 1 saturates and straddles bytes)."""
    from tinyproto.pipeline.compile import Fitted, TrainedOn, write_model_directory
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.families.flynn.quantize import IntFlyNN
    from tinyproto.families.flynn.train import FlyNNClassifier

    dataset = load_dataset("breast_cancer")
    sp = split(dataset)
    clf = FlyNNClassifier(n_hashes=m, n_inputs_per_hash=s, n_winners=rho, decay=0.5, random_state=3)
    clf.fit(sp.X_train, sp.y_train)
    model = IntFlyNN.from_classifier(clf, sp.X_train, sp.y_train, bits=bits)
    info = {"chosen": {"n_hashes": m, "count_bits": bits}, "candidates": []}
    write_model_directory(Fitted(clf, model, info), TrainedOn(dataset, sp, 0, 4096, board), out)
    return out


# ---- sizes and the solver (no device) ----------------------------------------------------------------------


def test_counts_and_frame_sizes():
    assert FL.count_bytes(597, 2, 1) == 150 and FL.count_bytes(203, 2, 3) == 153
    # 64 features, 10 classes: the PREDICT work area (2 + 64 + 40) is the largest, rounded up to 4
    assert FL.learn_frame_bytes(64, 10) == 72 + 64  # frame buffer (chunks of <= 64 B) + the int8 vector
    assert FL.learn_frame_bytes(30, 2) == 72 + 30


def test_learnable_compile_fits_sram_and_eeprom(compiled, tmp_path):
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    big = json.loads((compiled("digits", "2kB", "flynn") / "model.json").read_text())["hyperparameters"]
    result = compile_model("digits", CompileOptions("flynn", "2kB", 0, "uno", tmp_path / "dl", learnable=True))
    model = json.loads((tmp_path / "dl" / "model.json").read_text())
    from tinyproto.families import int_model_from_json

    sizes = FL.learn_sizes(int_model_from_json(model["int_model"]), BOARD)
    assert sizes.fits_sram and sizes.fits_eeprom
    assert model["hyperparameters"]["learnable"] is True and model["hyperparameters"]["n_hashes"] < big["n_hashes"]
    assert result.report["solver"]["learning"]["count_bytes"] == sizes.counts
    # working SRAM of the solver's formula is the model's own
    m = int_model_from_json(model["int_model"])
    assert FL.fly_working_bytes(m.n_winners, m.n_hash_inputs, m.n_classes, m.store_M, m.n_inputs_per_hash) == sum(
        item.nbytes for item in m.working_sram())


def test_counts_of_another_size_from_the_device_are_one_error_line():
    """A device running another model's learning firmware sends counts of another size: one line, no reshape."""
    from types import SimpleNamespace

    model = SimpleNamespace(n_hashes=546, n_classes=4, bits=2)
    good = bytes(FL.count_bytes(546, 4, 2))
    assert FL.unpack_counts(good, model).shape == (4, 546)
    for packed in (b"\x01\x02\x03\x04", good + b"\x00", b""):
        with pytest.raises(TinyprotoError, match="bytes of counts, this model's 546 x 4 counts of 2 bits take 546"):
            FL.unpack_counts(packed, model)


def test_learnable_is_flynn_only(tmp_path):
    result = cli("compile", "iris", "--model", "protonn", "--learnable", "--out", str(tmp_path / "x"))
    assert result.returncode == 1 and "only FlyNN learns" in result.stderr and "Traceback" not in result.stderr


def test_learn_refuses_a_family_that_cannot_learn(compiled):
    model_dir = compiled("iris", "1kB")  # ProtoNN
    result = cli("learn", str(model_dir), "--sim")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "only FlyNN learns on the device (this model is protonn)" in result.stderr
    assert not (model_dir / L.LEARNING_DIR).exists()


@pytest.mark.parametrize("save_eeprom", [False, True])
def test_too_big_model_is_refused_before_any_build(compiled, save_eeprom):
    model_dir = compiled("digits", "2kB", "flynn")
    args = ["learn", str(model_dir), "--sim"] + (["--save-eeprom"] if save_eeprom else [])
    result = cli(*args)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    from tinyproto.core.modeldir import load_model_dir

    sizes = FL.learn_sizes(families.load_int_model(load_model_dir(model_dir)), BOARD)
    fit = min(sizes.largest_m_sram, sizes.largest_m_eeprom) if save_eeprom else sizes.largest_m_sram
    assert f"At most m={fit} fits" in result.stderr and "--learnable" in result.stderr
    assert "SRAM needs" in result.stderr and ("EEPROM record needs" in result.stderr) == save_eeprom
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (model_dir / L.LEARNING_DIR).exists()  # refused before building anything


def test_a_model_with_a_count_scale_is_refused_before_any_build():
    """A FlyNN fitted on many rows keeps counts divided by q (count_scale); the device adds one per row, so
    learning would give counts of another meaning (a 10,000-row table: 32.6 % after learning, 67.2 % compiled)."""
    from tinyproto.families.flynn.quantize import IntFlyNN
    from tinyproto.families.flynn.train import FlyNNClassifier

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((300, 6)), np.arange(300) % 3
    clf = FlyNNClassifier(n_hashes=64, n_winners=8, decay=0.5, random_state=0).fit(X, y)
    with pytest.raises(TinyprotoError, match="divided by 4.*--learnable"):
        FL.check_learnable(IntFlyNN.from_classifier(clf, X, y, bits=2, count_scale=4), BOARD, False)
    FL.check_learnable(IntFlyNN.from_classifier(clf, X, y, bits=2), BOARD, False)


# ---- the learning app compiled for the host: saturation, chunks, errors, EEPROM emulation ------------------


def host_learning_app(model_dir: Path, out: Path) -> Path:
    from tinyproto.core.modeldir import load_model_dir

    md = load_model_dir(model_dir)
    project = L.prepare_learning_project(md, families.load_int_model(md), BOARD)
    lib = project / "lib" / "tinyproto"
    sources = [*sorted((project / "src").glob("*.c")), lib / "tp_serial.c", lib / "tp_flynn.c", lib / "tp_input.c",
               lib / "tp_judge.c"]
    cmd = ["gcc", "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-DTP_HOST", *DL.LEARN_FLAGS,
           f"-I{project / 'include'}", f"-I{lib}", *map(str, sources), "-lm", "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


@needs("gcc")
@pytest.mark.parametrize("bits, m", [(2, 101), (3, 203), (5, 77)])
def test_host_learning_app_saturates_like_the_host(tmp_path, bits, m):
    from tinyproto.core.modeldir import load_model_dir

    model_dir = flynn_dir(tmp_path / "model", bits, m)
    model = families.load_int_model(load_model_dir(model_dir))
    client = P.DeviceClient(PipePort(host_learning_app(model_dir, tmp_path / "app")), n_retries=1, timeout=2.0)
    try:
        hello = client.hello()
        assert hello.learning and hello.eeprom and not hello.raw_input
        assert np.array_equal(FL.unpack_counts(client.read_all_counts(), model), model.counts)  # boot: flash counts
        client.clear()
        assert not any(client.read_all_counts())
        rng = np.random.default_rng(bits)
        xq = rng.integers(-128, 128, size=(300, model.n_features)).astype(np.int8)
        xq[:100] = xq[0]  # one vector many times: its winners saturate
        y = rng.integers(0, model.n_classes, size=300)
        y[:100] = 1
        for i in range(len(xq)):
            assert client.learn(xq[i], int(y[i])).n_samples == i + 1
        expected = FL.host_counts(model, xq, y)
        assert expected.max() == (1 << bits) - 1
        # chunks of 7 bytes read the same bytes as the largest chunks
        total, _ = client.read_counts(0, 0)
        small = b"".join(client.read_counts(o, 7)[1] for o in range(0, total, 7))
        packed = client.read_all_counts()
        assert small == packed and total == FL.count_bytes(m, model.n_classes, bits)
        assert np.array_equal(FL.unpack_counts(packed, model), expected)
        # predictions use the learned counts
        learned = replace(model, counts=expected)
        for i in range(0, 300, 50):
            np.testing.assert_array_equal(client.predict(xq[i]).scores, learned.scores(xq[i : i + 1])[0])
        assert client.read_counts(total, 10) == (total, b"")
        with pytest.raises(P.DeviceError, match="out of range"):
            client.read_counts(total + 1, 1)
        # EEPROM: first save writes, the second one nothing; CLEAR then LOAD restores counts and n_samples
        first = client.eeprom_save()
        assert first.record == FL.EEPROM_HEADER_BYTES + total and 0 < first.written <= first.record
        assert client.eeprom_save().written == 0
        client.clear()
        loaded = client.eeprom_load()
        assert loaded.loaded and loaded.n_samples == 300
        assert client.read_all_counts() == packed
        client.info = None  # skip the client's own check: the device must refuse the label itself
        with pytest.raises(P.DeviceError, match="out of range"):
            client.learn(xq[0], model.n_classes)
    finally:
        client.close()


@needs("gcc")
def test_a_learn_sent_again_with_its_seq_is_answered_again_not_learned_twice(tmp_path):
    """The host sends a request again, with its seq, when the answer was lost or late (a busy host, a noisy line).
    The learning app answers that LEARN again with the same figures and does not learn the sample twice; any other
    request in between ends that, so a later LEARN that reuses the seq (after 256 requests) is learned."""
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.device.codec import MSG_LEARN, FrameReader, encode_frame

    model_dir = flynn_dir(tmp_path / "model", 2, 101)
    model = families.load_int_model(load_model_dir(model_dir))
    port = PipePort(host_learning_app(model_dir, tmp_path / "app"))
    client = P.DeviceClient(port, n_retries=1, timeout=2.0)
    reader = FrameReader(port)
    x = np.random.default_rng(1).integers(-128, 128, size=model.n_features).astype(np.int8)
    learn_frame = b"\x00" + encode_frame(MSG_LEARN, 200, bytes((1,)) + (0).to_bytes(2, "little") + x.tobytes())

    def learn_answers(times: int) -> list[bytes]:
        port.write(learn_frame * times)
        answers = [reader.read_frame(2.0) for _ in range(times)]
        assert all(a is not None and a.seq == 200 and a.type == MSG_LEARN | 0x80 for a in answers), answers
        return [a.payload for a in answers]

    try:
        client.hello()
        client.clear()
        assert model.n_features <= 64  # one chunk: the frame is the whole LEARN
        first, again, third = learn_answers(3)
        assert first == again == third and int.from_bytes(first[:4], "little") == 1
        once = FL.host_counts(model, x[None, :], np.array([1]))
        assert np.array_equal(FL.unpack_counts(client.read_all_counts(), model), once)
        assert int.from_bytes(learn_answers(1)[0][:4], "little") == 2  # READ_COUNTS came between: learned
        assert not np.array_equal(FL.unpack_counts(client.read_all_counts(), model), once)
    finally:
        client.close()


# ---- the simulated Uno -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def learned_bc(shared_once, tmp_path_factory):
    """breast_cancer compiled --learnable, learned on the simulated Uno with --save-eeprom (the CLI)."""
    if shutil.which("avr-gcc") is None or not HAVE_SIM:
        pytest.skip("needs avr-gcc and libsimavr-dev")

    def make(root: Path) -> None:  # once per run for all workers; each worker's module gets a copy
        out = root / "bc"
        compiled = cli("compile", "breast_cancer", "--model", "flynn", "--budget", "1kB", "--learnable", "--out",
                       str(out))
        assert compiled.returncode == 0, compiled.stderr
        # a relative model directory, as a user types it
        result = cli("learn", "bc", "--data", "breast_cancer", "--sim", "--save-eeprom", "--json", cwd=root)
        assert result.returncode == 0, result.stderr
        (root / "learn-stdout.json").write_text(result.stdout)

    copy = fresh_copy(shared_once("learned-breast_cancer-flynn-1kB", make), tmp_path_factory, "learn")
    return copy / "bc", json.loads((copy / "learn-stdout.json").read_text())


@pytest.mark.device
def test_device_learns_exactly_the_host_counts(learned_bc):
    out, summary = learned_bc
    assert summary == json.loads((out / "learn.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert summary["n_samples"] == report["n_train"] and summary["counts_identical"]
    # learning the compile data set again gives the compiled counts: the device learned what the host did
    assert summary["counts_equal_compiled_model"]
    test = summary["test"]
    assert test["score_agreement"] == 1.0 and test["label_agreement"] == 1.0
    assert test["device_accuracy"] == pytest.approx(report["int8_accuracy"])
    assert summary["learn_cycles_mean"] > 1000
    # SRAM: the static part is exactly counts + frame buffer + app state; the measured total keeps a margin
    sram = summary["sram"]
    assert sram["static_bytes"] == sram["count_bytes"] + sram["frame_buffer_bytes"] + sram["app_static_bytes"]
    assert sram["stack_peak_bytes"] <= sram["inference_stack_bytes"] + sram["reserved_bytes"] // 2
    assert sram["used_bytes"] <= sram["sram_estimate_bytes"] and sram["margin_bytes"] >= 256
    eeprom = summary["eeprom"]
    assert eeprom["saved"] and eeprom["reloaded_identical"]
    assert eeprom["record_bytes"] == FL.EEPROM_HEADER_BYTES + summary["count_bytes"]
    assert 0 < eeprom["bytes_written"] <= eeprom["record_bytes"]  # erased EEPROM: nearly every byte changes


@pytest.mark.device
def test_learned_model_validates_bit_exactly(learned_bc):
    out, summary = learned_bc
    learned = out / L.LEARNED_DIR
    meta = json.loads((learned / "model.json").read_text())
    assert meta["model_hash"] == summary["learned_model_hash"] and meta["learned_on_device"]["counts_identical"]
    result = cli("validate", str(learned), "--sim", "--json", "--no-raw")
    assert result.returncode == 0, result.stderr
    v = json.loads(result.stdout)
    assert v["score_agreement"] == 1.0 and v["label_agreement"] == 1.0 and v["complete"]


@pytest.mark.device
def test_eeprom_survives_a_restart_and_guards_its_record(learned_bc, tmp_path):
    from tinyproto.device.sim import SimulatedUno
    from tinyproto.core.modeldir import load_model_dir

    out, summary = learned_bc
    md = load_model_dir(out)
    model = families.load_int_model(md)
    elf = out / L.LEARNING_DIR / json.loads((out / L.LEARNING_DIR / "build.json").read_text())["elf"]
    image = tmp_path / "eeprom.bin"
    shutil.copyfile(out / L.LEARNING_DIR / L.EEPROM_IMAGE, image)
    assert image.stat().st_size == BOARD.eeprom_bytes
    with SimulatedUno(elf, markers=False, eeprom=image) as uno, P.open_device(uno.port) as client:
        assert client.info.learning and client.info.eeprom
        client.clear()
        loaded = client.eeprom_load()
        assert loaded.loaded and loaded.n_samples == summary["n_samples"]
        assert np.array_equal(FL.unpack_counts(client.read_all_counts(), model), model.counts)
        client.clear()  # the EEPROM keeps the record: CLEAR touches SRAM only
    with SimulatedUno(elf, markers=False, eeprom=image) as uno, P.open_device(uno.port) as client:
        assert client.eeprom_load().loaded
    # one flipped count bit: the CRC refuses the record and the SRAM counts stay as they were
    data = bytearray(image.read_bytes())
    data[FL.EEPROM_HEADER_BYTES + 3] ^= 0x10
    image.write_bytes(bytes(data))
    with SimulatedUno(elf, markers=False, eeprom=image) as uno, P.open_device(uno.port) as client:
        client.clear()
        assert client.eeprom_load().status == P.EEPROM_EMPTY
        assert not any(client.read_all_counts())
    image.write_bytes(bytes(BOARD.eeprom_bytes + 1))  # not an ATmega328P EEPROM image
    with pytest.raises(TinyprotoError, match="larger than the 1024 bytes of EEPROM"):
        SimulatedUno(elf, markers=False, eeprom=image).__enter__()


@pytest.mark.device
def test_counts_straddling_bytes_saturate_on_the_avr(tmp_path, learned_bc):
    """3-bit counts (entries cross byte boundaries, many saturate) learned on the simulated AVR; the EEPROM record
    of another model (breast_cancer's learnable one) is recognised as such and not loaded."""
    from tinyproto.device.sim import SimulatedUno
    from tinyproto.core.modeldir import load_model_dir

    model_dir = flynn_dir(tmp_path / "b3", bits=3, m=203)
    summary = L.learn_on_device(model_dir, L.LearnOptions("breast_cancer", build_learned=False))
    assert summary["counts_identical"] and summary["test"]["score_agreement"] == 1.0
    counts = families.load_int_model(load_model_dir(model_dir / L.LEARNED_DIR)).counts
    assert (counts == 7).sum() > 10 and ((counts > 0) & (counts < 7)).sum() > 10
    other = learned_bc[0] / L.LEARNING_DIR / L.EEPROM_IMAGE
    image = tmp_path / "other.bin"
    shutil.copyfile(other, image)
    elf = model_dir / summary["firmware"]["elf"]
    with SimulatedUno(elf, markers=False, eeprom=image) as uno, P.open_device(uno.port) as client:
        assert client.eeprom_load().status == P.EEPROM_OTHER


@pytest.mark.device
def test_firmware_that_cannot_learn_says_so(learned_bc, tmp_path):
    from tinyproto.device.sim import SimulatedUno

    out = tmp_path / "copy"
    shutil.copytree(learned_bc[0], out)
    built = cli("build", str(out))
    assert built.returncode == 0, built.stderr
    elf = out / json.loads((out / "build.json").read_text())["elf"]
    with SimulatedUno(elf, markers=False) as uno:
        with P.open_device(uno.port) as client:
            assert not client.info.learning
            with pytest.raises(TinyprotoError, match="this firmware cannot learn; run tinyproto learn"):
                client.learn(np.zeros(client.info.n_features, np.int8), 0)
            client.info = None  # the device's own answer (ERROR unknown type) gives the same message
            with pytest.raises(TinyprotoError, match="this firmware cannot learn; run tinyproto learn"):
                client.clear()
        result = cli("learn", str(out), "--port", uno.port, "--no-flash")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    # the line's hint is for this very run: --no-flash, not "run tinyproto learn"
    assert (f"the board on {uno.port} runs a firmware that cannot learn, not this model's learning firmware: run "
            "learn without --no-flash, which builds and flashes it") in result.stderr


def test_learn_on_a_leonardo_needs_its_usb_upload_port(tmp_path):
    """The Leonardo is flashed through its own USB port and talks on Serial1: learn --port alone is refused before
    anything is built, naming --upload-port, as flash and run do."""
    leo = flynn_dir(tmp_path / "leonardo", bits=1, m=64, board=load_board("leonardo"))
    result = cli("learn", str(leo), "--port", "/dev/ttyUSB9")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "give --upload-port" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (leo / L.LEARNING_DIR).exists()
    result = cli("learn", str(leo), "--upload-port", "/dev/ttyACM9")
    assert result.returncode == 1 and "--upload-port needs --port too" in result.stderr
# ----------------------------------------------------------------------------------------------------------- ports


@pytest.mark.parametrize("port", ["/nonexistent-port", "/dev/null", ".", "data.csv"])
def test_learn_checks_the_port_before_building(compiled, work, port):
    """Was: refused only after the learning firmware's build (about 30 s)."""
    model = compiled("iris", "1kB", "flynn", learnable=True)
    (work / "data.csv").write_text("a,b\n1,2\n")
    refused(["learn", str(model), "--port", port], port.lstrip("./") or "port", work)
    assert not (model / "learning").exists(), "the learning firmware was built before the port was checked"


@pytest.mark.parametrize("kind", ["directory", "missing"])
def test_learn_checks_the_test_vectors_before_building(compiled, work, kind):
    """A damaged test_vectors.npz was refused only after the learning firmware's build, leaving learning/ built."""
    model = compiled("iris", "1kB", "flynn", learnable=True)
    vectors = model / "test_vectors.npz"
    vectors.unlink()
    if kind == "directory":
        vectors.mkdir()
    refused(["learn", str(model), "--sim"], "test_vectors.npz", work)
    assert not (model / "learning").exists(), "the learning firmware was built before the vectors were checked"


def test_learn_on_a_model_json_without_its_dataset_says_it_is_damaged(compiled, work):
    """model.json without its dataset: once "say which data to learn: --data FILE (the model was compiled on
    None)"; compile always writes it, so the file is damaged, said before anything is built."""
    import json

    model = compiled("iris", "1kB", "flynn", learnable=True)
    meta = json.loads((model / "model.json").read_text())
    del meta["dataset"]
    (model / "model.json").write_text(json.dumps(meta))
    line = refused(["learn", str(model), "--sim"], "has no dataset", work)
    assert "None" not in line and not (model / "learning").exists(), line


@pytest.mark.parametrize("manifest", [False, True])
def test_a_learned_directory_holding_the_users_files_is_refused_before_learning(compiled, manifest):
    """learn refused it only after the device had learned, when it wrote the learned model, and in words about an
    --out that learn does not have ("--out m/learned is not empty ...")."""
    model = compiled("iris", "1kB", "flynn", learnable=True)
    learned = model / "learned"
    learned.mkdir()
    if manifest:
        (learned / ".tinyproto").write_text('{"written_by": "tinyproto", "version": 1, "files": {}}')
    (learned / "notes.txt").write_text("precious\n")
    line = refused(["learn", str(model), "--sim"], "where learn writes the learned model", model.parent)
    assert "--out" not in line and "notes.txt" in line


@pytest.mark.device
def test_device_figures_that_are_no_measurement_fail_learn(learned_bc, monkeypatch, tmp_path):
    """A device that learns every count right but reports a stack peak of 0 and 0 cycles per learning step: learn
    exits 1 naming both, and learn.json leaves the figures derived from them out (null) instead of printing
    '0 cycles = 0.00 ms' and an SRAM margin from a stack of nothing."""
    from click.testing import CliRunner

    from tinyproto.cli import main
    from tinyproto.device import client
    from tinyproto.device.codec import LearnAck, Stats

    out = tmp_path / "bc"
    shutil.copytree(learned_bc[0], out, symlinks=True)
    stats, learn = client.DeviceClient.stats, client.DeviceClient.learn
    monkeypatch.setattr(client.DeviceClient, "stats", lambda self: Stats(0, stats(self).static_sram, 0))
    monkeypatch.setattr(client.DeviceClient, "learn",
                        lambda self, xq, label: LearnAck(learn(self, xq, label).n_samples, 0))
    result = CliRunner().invoke(main, ["learn", str(out), "--data", "breast_cancer", "--sim"])
    assert result.exit_code == 1, result.output
    assert "stack peak of 0 B" in result.stderr and "0 cycles" in result.stderr, result.stderr
    summary = json.loads((out / "learn.json").read_text())
    assert summary["counts_identical"] and len(summary["device_figure_problems"]) == 2
    assert summary["learn_cycles_mean"] is None and summary["learn_ms_mean"] is None
    assert summary["sram"]["stack_peak_bytes"] is None and summary["sram"]["margin_bytes"] is None


def test_learn_data_with_other_features_names_the_file_as_given(compiled, work):
    """Was: "d has 1 features, the model 4" (the data set's stem, and '1 features')."""
    model = compiled("iris", "1kB", "flynn", learnable=True)
    (work / "d.csv").write_text("f0,label\n" + "".join(f"{i % 7}.5,{i % 3}\n" for i in range(60)))
    line = refused(["learn", str(model), "--data", "d.csv", "--sim"], "features", work)
    assert "--data d.csv has 1 feature, the model was compiled on 4" in line, line
    assert not (model / "learning").exists()


@pytest.mark.parametrize("kind", ["directory", "link", "fifo"])
def test_an_eeprom_image_that_is_not_a_file_is_refused_before_building(compiled, tmp_path, kind):
    """learning/eeprom.bin, the simulated board's EEPROM across runs: a directory there was kept and learn went on
    without EEPROM state; a link would have the simulator write into the file it points at. One line, before the
    learning firmware's build, and nothing changed."""
    from tinyproto.core.manifest import record_outputs

    model = compiled("iris", "1kB", "flynn", learnable=True)
    record_outputs(model, "learning")  # as learn does before it writes learning/ (the name is tinyproto's)
    image = model / "learning" / "eeprom.bin"
    image.parent.mkdir()
    outside = tmp_path / "mine.bin"
    outside.write_bytes(b"precious")
    if kind == "directory":
        image.mkdir()
    elif kind == "link":
        image.symlink_to(outside)
    else:
        os.mkfifo(image)
    line = refused(["learn", str(model), "--sim"], f"{image} ", image.parent)
    assert "move it away" in line
    assert outside.read_bytes() == b"precious" and not (model / "learning" / "platformio.ini").exists()
