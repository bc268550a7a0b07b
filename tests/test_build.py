"""Offline firmware builds (PlatformIO with tinyproto's local platform, avr-gcc fallback) and `pio test`.

Uses the fake model project in tests/fixtures/sim/project (scores[c] = (c + 1) * sum(x)).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from tinyproto.core.boards import load_board
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.ledger import FirmwareSizes

FIXTURE_PROJECT = Path(__file__).parent / "fixtures" / "sim" / "project"
REPO = Path(__file__).resolve().parent.parent

needs_avr = pytest.mark.skipif(shutil.which("avr-gcc") is None, reason="avr-gcc not installed")
needs_pio = pytest.mark.skipif(
    importlib.util.find_spec("platformio") is None or importlib.util.find_spec("SCons") is None,
    reason="platformio / scons not installed",
)
needs_simavr = pytest.mark.skipif(
    not Path("/usr/include/simavr/sim_avr.h").is_file(), reason="libsimavr-dev not installed"
)

AVR_SIZE_SAMPLE = """\
firmware.elf  :
section                     size      addr
.data                         18   8388864
.text                       1234         0
.bss                          40   8388882
.noinit                        2   8388922
.comment                      17         0
.note.gnu.avr.deviceinfo      64         0
.debug_info                 1904         0
Total                       3279
"""


pytestmark = pytest.mark.usefixtures("private_cache")


def make_project(root: Path) -> Path:
    """A copy of the fixture project as the renderer would lay it out (runtime header + platformio.ini)."""
    from tinyproto.device.build import render_platformio_ini

    project = root / "project"
    shutil.copytree(FIXTURE_PROJECT, project)
    for header in ("tinyproto.h", "tp_avr.h"):  # the runtime headers the fixture's sources include
        shutil.copyfile(REPO / "firmware" / header, project / "lib" / "tinyproto" / header)
    (project / "platformio.ini").write_text(render_platformio_ini(load_board("uno")))
    return project


def fake_reference(xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sums = xq.astype(np.int64).sum(axis=1)
    scores = np.stack([sums * (c + 1) for c in range(3)], axis=1)
    return scores, scores.argmax(axis=1)  # argmax: ties go to the lowest index, like the firmware


@pytest.fixture(scope="module")
def pio_build(tmp_path_factory):
    """The fixture project built once with `pio run -e uno_sim` (offline)."""
    from tinyproto.device.build import build_project

    if shutil.which("avr-gcc") is None or importlib.util.find_spec("platformio") is None:
        pytest.skip("needs avr-gcc and platformio")
    project = make_project(tmp_path_factory.mktemp("pio"))
    return project, build_project(project, "uno_sim")


# ---------------------------------------------------------------------------------------------------------


def test_parse_avr_size():
    from tinyproto.device.build import parse_avr_size

    assert parse_avr_size(AVR_SIZE_SAMPLE) == FirmwareSizes(text_bytes=1234, data_bytes=18, bss_bytes=42)
    with pytest.raises(TinyprotoError):
        parse_avr_size("avr-size: 'x.elf': No such file")


def test_platformio_ini_has_the_three_environments():
    from tinyproto.device.build import render_platformio_ini

    ini = render_platformio_ini(load_board("uno"))
    for section in ("[env:uno]", "[env:uno_offline]", "[env:uno_sim]"):
        assert section in ini
    assert "platform = atmelavr" in ini
    assert not [line for line in ini.splitlines() if line.startswith("framework")]  # bare avr-libc C
    assert "-std=gnu99 -Wall -Wextra -Werror -Iinclude -Ilib/tinyproto" in ini
    assert "board_build.f_cpu = 16000000UL" in ini
    assert "tinyproto.device.sim" in ini and "--stdio" in ini
    # portable: the platform by name from tinyproto's PlatformIO home (core_dir with ~), no installation path
    assert "platform = tinyproto-avr" in ini and "core_dir = ~/.cache/tinyproto/pio-core" in ini
    assert "symlink://" not in ini and "file://" not in ini and sys.executable not in ini
    assert str(REPO) not in ini and str(Path.home()) not in ini


@needs_avr
@needs_pio
def test_pio_run_offline_builds_elf_hex_and_sizes(pio_build):
    project, result = pio_build
    assert result.tool == "platformio"
    assert result.elf == project / ".pio" / "build" / "uno_sim" / "firmware.elf"
    assert result.elf.is_file() and result.hex.is_file()
    assert result.hex.read_text().startswith(":")
    assert 200 < result.sizes.text_bytes < 4096
    assert result.sizes.stack_peak_bytes is None
    assert "SUCCESS" in result.log


@needs_avr
def test_avr_gcc_fallback_gives_the_same_firmware_size(pio_build, tmp_path, monkeypatch):
    from tinyproto.device import build

    _, pio_result = pio_build
    monkeypatch.setattr(build, "platformio_available", lambda: False)
    project = make_project(tmp_path)
    with pytest.warns(UserWarning, match="avr-gcc directly"):
        result = build.build_project(project, "uno_sim")
    assert result.tool == "avr-gcc"
    assert result.elf.is_file() and result.hex.is_file()
    assert result.sizes == pio_result.sizes  # same sources, same flags


@needs_avr
@pytest.mark.parametrize("use_pio", [True, False], ids=["platformio", "avr-gcc"])
def test_compile_error_reports_the_compiler_error(tmp_path, monkeypatch, use_pio):
    from tinyproto.device import build

    if use_pio and not build.platformio_available():
        pytest.skip("platformio not installed")
    monkeypatch.setattr(build, "platformio_available", lambda: use_pio)
    project = make_project(tmp_path)
    main = project / "src" / "main.c"
    main.write_text(main.read_text().replace("uart_init();\n    for", "uart_init();\n    int unused_var;\n    for"))
    with pytest.raises(TinyprotoError, match="unused_var") as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the avr-gcc path also warns that PlatformIO is missing
        build.build_project(project, "uno_sim")
    assert "error" in str(info.value)
    assert "main.c" in str(info.value)


def test_missing_avr_gcc_names_the_apt_packages(tmp_path, monkeypatch):
    from tinyproto.device import build, piohome

    monkeypatch.setattr(piohome.shutil, "which", lambda name, *a, **k: None)
    project = make_project(tmp_path)
    with pytest.raises(TinyprotoError, match="apt-get install gcc-avr avr-libc binutils-avr"):
        build.build_project(project, "uno_sim")


@needs_pio
@pytest.mark.parametrize("name, said", [("m\tx", r"m\\tx/project: its path holds a tab"),
                                        ("m  x", r"m  x/project: its path holds 2 spaces in a row")])
def test_a_path_with_a_tab_is_refused_before_platformio_writes_beside_it(tmp_path, name, said):
    """PlatformIO turns a tab of the project's path into a space, and two spaces into one: it wrote .pio/ into
    "m x" (another directory, perhaps the user's) and failed with "Nothing to build". Refused in one line, nothing
    written."""
    from tinyproto.device.build import build_project

    project = make_project(tmp_path / name)
    with pytest.raises(TinyprotoError, match=r"cannot build in .*" + said) as info:
        build_project(project, "uno_sim")
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert not (project / ".pio").exists()


@needs_pio
def test_a_project_under_a_non_utf8_name_is_refused_before_platformio(tmp_path):
    """A model compiled from a working directory whose name is not UTF-8 (`--out` is refused so, not a relative one
    under it): PlatformIO failed with "An unexpected error occurred ... Report this problem to the developers"."""
    from tinyproto.device.build import build_project

    name = os.fsdecode(b"d\xff\xfe")
    project = make_project(tmp_path / name)
    with pytest.raises(TinyprotoError, match=r"cannot build in .*d\\xff\\xfe/project: its path is not UTF-8") as info:
        build_project(project, "uno_sim")
    assert "\n" not in str(info.value)
    assert not (project / ".pio").exists()


@pytest.mark.parametrize("part", ["src", "include", "lib"])
def test_a_file_where_the_project_has_a_directory_is_one_line(tmp_path, part):
    """Was: SCons's own traceback inside the build failure (src) or a missing-header compiler error (lib)."""
    from tinyproto.device.build import build_project

    project = make_project(tmp_path)
    target = project / part
    if target.is_dir():
        shutil.rmtree(target)
    target.write_text("the user's notes\n")
    with pytest.raises(TinyprotoError, match=f"{part} is not a directory, where the generated project keeps") as info:
        build_project(project, "uno_sim")
    assert "\n" not in str(info.value) and "move it away" in str(info.value)
    assert target.read_text() == "the user's notes\n" and not (project / ".pio").exists()


def test_unknown_environment_is_a_clear_error(tmp_path):
    from tinyproto.device.build import build_project

    with pytest.raises(TinyprotoError, match="uno_sim"):
        build_project(make_project(tmp_path), "nano")


@needs_avr
@needs_simavr
def test_built_firmware_answers_on_the_simulated_uno(pio_build):
    serial = pytest.importorskip("serial")
    from tinyproto.device.sim import SimulatedUno

    _, result = pio_build
    x = np.array([[1, 2, 3, -1], [-100, -100, -100, 5]], dtype=np.int8)
    scores, labels = fake_reference(x)
    with SimulatedUno(result.elf) as uno:
        with serial.Serial(uno.port, 115200, timeout=1) as port:
            for row, want_scores, want_label in zip(x, scores, labels):
                port.write(row.tobytes())
                reply = port.read(13)
                assert reply[0] == want_label
                assert list(struct.unpack("<3i", reply[1:])) == list(want_scores)
            port.write(bytes([0x7F] * 4))
        assert uno.wait(timeout=10) == 0
        markers = uno.markers()
    assert [value for value, _ in markers] == [1, 2, 1, 2]
    assert all(0 < markers[i + 1][1] - markers[i][1] < 2000 for i in (0, 2))


@needs_avr
@needs_pio
@needs_simavr
def test_pio_test_on_the_simulated_uno_passes_and_fails(pio_build, tmp_path):
    from tinyproto.device.build import render_pio_test, run_pio_test

    project, built = pio_build
    firmware_before = built.elf.read_bytes()
    xq = np.array([[1, 2, 3, -1], [5, -10, 0, 0], [0, 0, 0, 0], [127, 127, -128, 1]], dtype=np.int8)
    scores, labels = fake_reference(xq)
    test_dir = render_pio_test(project, xq, scores, labels)
    assert (test_dir / "test_main.c").is_file() and (project / "test" / "test_custom_runner.py").is_file()
    passed, log = run_pio_test(project, "uno_sim")
    assert passed, log
    assert "4 succeeded" in log

    wrong = scores.copy()
    wrong[2, 1] += 1  # one score off by one must fail the run
    render_pio_test(project, xq, wrong, labels)
    passed, log = run_pio_test(project, "uno_sim")
    assert not passed
    assert "test_vector_2" in log and "FAIL" in log
    assert built.elf.read_bytes() == firmware_before  # the test program is built elsewhere


@needs_avr
@needs_simavr
def test_sim_test_without_platformio(tmp_path, monkeypatch):
    from tinyproto.device import build, piohome

    monkeypatch.setattr(piohome, "platformio_available", lambda: False)
    project = make_project(tmp_path)
    xq = np.array([[3, 1, -4, 1]], dtype=np.int8)
    scores, labels = fake_reference(xq)
    build.render_pio_test(project, xq, scores, labels)
    with pytest.warns(UserWarning):
        passed, log = build.run_pio_test(project, "uno_sim")
    assert passed, log
    build.render_pio_test(project, xq, scores, (labels + 1) % 3)
    with pytest.warns(UserWarning):
        passed, log = build.run_pio_test(project, "uno_sim")
    assert not passed and "label Expected" in log


@needs_avr
@needs_pio
def test_the_pio_home_holds_a_copy_of_the_platform_kept_in_step():
    """The platform is installed as a copy (the home outlives checkouts and venvs); a later prepare puts back what
    changed, drops what the source no longer has, and keeps the toolchain link old projects name by path."""
    from tinyproto.device.piohome import offline_platform_dir, prepare_pio_core, tinyproto_cache_dir

    core = prepare_pio_core()
    installed = core / "platforms" / "tinyproto-avr"
    source = offline_platform_dir()
    assert not installed.is_symlink()
    assert (installed / "platform.json").read_bytes() == (source / "platform.json").read_bytes()
    (installed / "builder" / "main.py").write_text("# edited\n")
    (installed / "boards" / "stale.json").write_text("{}")
    prepare_pio_core()
    assert (installed / "builder" / "main.py").read_bytes() == (source / "builder" / "main.py").read_bytes()
    assert not (installed / "boards" / "stale.json").exists()
    assert (tinyproto_cache_dir() / "pio-toolchain-atmelavr" / "bin" / "avr-gcc").exists()
    assert (core / "packages" / "toolchain-atmelavr" / ".piopm").is_file()


@pytest.mark.parametrize("words", ["No space left on device", "Disk quota exceeded"])
def test_a_build_on_a_full_disk_says_so_in_one_line(tmp_path, words):
    """A full disk during `pio run` was reported as pages of "can't write 60 bytes to section" and SCons' own
    traceback text (seen with a 2 MB tmpfs holding the model directory)."""
    from tinyproto.device.project import build_failure

    log = (f"/tmp/cc1.s: Fatal error: can't write 60 bytes to section .text of .pio/build/uno_sim/x.o because: "
           f"'{words}'\n*** [.pio/build/uno_sim/x.o] Error 1\nOSError: [Errno 28] {words}:\n  File \"Main.py\"")
    line = build_failure("pio run -e uno_sim", log, tmp_path / ".pio")
    assert "\n" not in line and "no space left" in line and str(tmp_path) in line and "Main.py" not in line
    # the compilers write in the tool's TMPDIR: a full one reads the same (export's measurement said it cut short)
    import tempfile

    from tinyproto.device.library_cost import _failure

    assert f"temporary directory {tempfile.gettempdir()}" in line
    assert _failure(log, tmp_path).startswith("measuring the model's library failed (avr-gcc): no space left on")
    assert build_failure("avr-gcc", "src/main.c:5:9: error: x", tmp_path).startswith("firmware build failed (avr-gcc):")


def test_the_first_errors_are_the_compilers_not_platformios_banner():
    """A fresh PlatformIO home prints a banner framed by rows of stars before the build: the excerpt a failed
    build shows starts at the compiler's error, not at the banner."""
    from tinyproto.device.project import _first_errors

    stars = "*" * 80
    log = (f"{stars}\nIf you like PlatformIO, please:\n- star it on GitHub\n{stars}\n\nProcessing uno_sim\n"
           "src/main.c: In function 'main':\nsrc/main.c:5:9: error: unused variable 'x' [-Werror=unused-variable]\n"
           "*** [.pio/build/uno_sim/src/main.o] Error 1\n")
    excerpt = _first_errors(log)
    assert excerpt.startswith("src/main.c: In function 'main':\nsrc/main.c:5:9: error: unused variable 'x'")
    assert "PlatformIO" not in excerpt


@pytest.mark.parametrize("end", ["timeout", "interrupt"])
def test_a_build_tool_ended_early_takes_everything_it_started_with_it(tmp_path, end):
    """project._run (pio run, avr-gcc, avr-size) ended by a timeout or by Ctrl-C / SIGTERM in tinyproto ends the
    tool's whole process group: `pio run` starts scons and scons the compilers, which kept building into .pio/
    after tinyproto had exited 130 (subprocess.run ended only pio)."""
    import signal
    import subprocess
    import threading
    import time

    from tinyproto.device.project import _run

    pid_file = tmp_path / "grandchild.pid"
    command = ["sh", "-c", f'sleep 300 & echo $! > "{pid_file}"; wait']
    if end == "timeout":
        with pytest.raises(subprocess.TimeoutExpired):
            _run(command, timeout=1.0)
    else:
        def interrupt_when_started() -> None:
            while not pid_file.exists() or not pid_file.read_text().strip():
                time.sleep(0.02)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

        previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as under the CLI, even under nohup
        try:
            threading.Thread(target=interrupt_when_started, daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                _run(command, timeout=60)
        finally:
            signal.signal(signal.SIGINT, previous)
    if not _ends_within(int(pid_file.read_text()), seconds=10):
        pytest.fail("the tool's child outlived the interrupted run")


def _ends_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` ends (or is a zombie waiting for init) within `seconds`; if not it is killed."""
    import os
    import signal
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(")")[-1].split()[0] == "Z":  # ended, waiting for init to reap it
                return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return False


def test_a_build_tool_ends_with_a_tinyproto_killed_by_sigkill(tmp_path):
    """`kill -9` of tinyproto (learn, build) left `pio run` and its compilers building into .pio/ for seconds,
    beside the next run's build: the tool's group leader gets the parent-death signal and ends its group."""
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "grandchild.pid"
    script = "import sys; from tinyproto.device.project import _run; _run(sys.argv[1:], timeout=120)"
    runner = subprocess.Popen([sys.executable, "-c", script, "sh", "-c", 'sleep 300 & echo $! > "$0"; wait',
                               str(pid_file)], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert runner.poll() is None and time.monotonic() < deadline, "the tool never started"
            time.sleep(0.02)
        runner.kill()
        runner.wait()
        if not _ends_within(int(pid_file.read_text()), seconds=10):
            pytest.fail("the tool's child outlived a tinyproto killed by SIGKILL")
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()


@needs_avr
def test_a_build_removes_the_scons_database_temporary_file_a_stopped_build_left(tmp_path):
    """SCons writes its signature database through .sconsign<version>.tmp: a build stopped by a full disk (seen on
    a 4 MB tmpfs) or a kill left it in .pio/, and no later build removed it. Any later build does, failed or not;
    the database itself and every other file stay."""
    from tinyproto.device import build

    if not build.platformio_available():
        pytest.skip("platformio not installed")
    project = make_project(tmp_path)
    build.build_project(project, "uno_sim")  # PlatformIO empties a build directory it has not built in before
    leftovers = [project / ".pio" / "build" / "uno_sim" / ".sconsign311.tmp", project / ".pio" / ".sconsign39.tmp"]
    kept = project / ".pio" / "build" / "uno_sim" / "notes.tmp"
    for path in [*leftovers, kept]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a database")
    main = project / "src" / "main.c"
    main.write_text(main.read_text().replace("uart_init();\n    for", "uart_init();\n    int unused_var;\n    for"))
    with pytest.raises(TinyprotoError, match="unused_var"):
        build.build_project(project, "uno_sim")
    assert not any(path.exists() for path in leftovers) and kept.read_bytes() == b"half a database"


@needs_pio
def test_a_build_from_a_working_directory_that_was_deleted(compiled, tmp_path):
    """`cd dir; rm -r ../dir; tinyproto build /abs/model`: PlatformIO, started in the deleted directory, failed with
    "An unexpected error occurred" (its getcwd()); the tools now start in their scratch directory."""
    import os
    import subprocess

    from helpers import ROOT

    model = compiled("iris", "1kB")
    gone = tmp_path / "gone"
    gone.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    script = f'cd "{gone}" && rmdir "{gone}" && exec "{sys.executable}" -m tinyproto build "{model}"'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert (model / "build.json").is_file() and not gone.exists()
