"""Output under any locale: every verb's --help and normal runs under C, POSIX and a UTF-8 locale, with stdout a
pipe, a file and a terminal (pty). Under a locale that is not UTF-8 the output is ASCII (core/terminal.py); no
run may end in UnicodeEncodeError (an internal error, exit 70) or print a traceback."""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tinyproto.core.terminal import AsciiStream, to_ascii

VERBS = ["board-sim", "boards", "build", "compile", "export", "federate", "flash", "learn", "report", "run",
         "sweep", "validate"]
LOCALES = ["C", "POSIX", "C.UTF-8"]
STDOUT_KINDS = ["pipe", "file", "pty"]


def _env(locale: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONUTF8", "PYTHONIOENCODING"))}
    env.update(LC_ALL=locale, LANG=locale, PYTHONUTF8="0", COLUMNS="100")
    return env


# One interpreter running `python -m tinyproto ARGS` for several ARGS in turn, as runpy runs it for `-m` (each run
# ends in SystemExit, whose code it records): one start-up, numpy and scikit-learn imported once, for the help of
# every verb. The ARGS reach it as its own command line (each list after its length), so the interpreter decodes
# them as it decodes a `tinyproto` command's (a non-ASCII file name under LC_ALL=C too). Each run's output follows a
# line `@@@ run K` (K counts the runs from 0) and its exit code is on a line `@@@ exit CODE`.
MANY_RUNS = """
import runpy, sys
rest, run = sys.argv[1:], 0
while rest:
    args, rest = rest[1:1 + int(rest[0])], rest[1 + int(rest[0]):]
    print("@@@ run", run, flush=True)
    run += 1
    sys.argv = ["tinyproto", *args]
    try:
        runpy.run_module("tinyproto", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    print("@@@ exit", code, flush=True)
"""


def _run_many(arg_lists: list[list[str]], locale: str, kind: str, tmp_path: Path) -> list[tuple[int, bytes]]:
    """Run `python -m tinyproto ARGS` for each ARGS in one interpreter (MANY_RUNS), under `locale` with stdout
    `kind`; [(exit, stdout bytes)] per ARGS. The interpreter's own exit and stderr are checked here."""
    flat = [word for args in arg_lists for word in (str(len(args)), *args)]
    code, out, err = _run(arg_lists, locale, kind, tmp_path, command=[sys.executable, "-c", MANY_RUNS, *flat])
    _check(code, b"", err, locale)
    parts = out.replace(b"\r\n", b"\n").split(b"@@@ ")[1:]
    runs = []
    for k, (started, ended) in enumerate(zip(parts[0::2], parts[1::2])):
        assert started.split(b"\n", 1)[0] == f"run {k}".encode(), started[:200]
        assert ended.startswith(b"exit "), ended[:200]
        runs.append((int(ended.split()[1]), started.split(b"\n", 1)[1]))
    assert len(runs) == len(arg_lists), out[-2000:]
    return runs


def _run(args: list, locale: str, kind: str, tmp_path: Path, timeout: float = 600,
         command: list[str] | None = None) -> tuple[int, bytes, bytes]:
    """Run `python -m tinyproto ARGS` (or `command`) with stdout a pipe, a file or a pty; (exit, stdout bytes,
    stderr bytes)."""
    command = command or [sys.executable, "-m", "tinyproto", *args]
    env = _env(locale)
    if kind == "pipe":
        done = subprocess.run(command, env=env, capture_output=True, timeout=timeout, cwd=tmp_path)
        return done.returncode, done.stdout, done.stderr
    if kind == "file":
        out = tmp_path / f"stdout-{os.getpid()}.txt"
        with open(out, "wb") as sink:
            done = subprocess.run(command, env=env, stdout=sink, stderr=subprocess.PIPE, timeout=timeout, cwd=tmp_path)
        data = out.read_bytes()
        out.unlink()
        return done.returncode, data, done.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen(command, env=env, stdout=slave, stderr=subprocess.PIPE, cwd=tmp_path)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError(f"{args} produced nothing for {timeout} s")
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    err = proc.stderr.read()
    proc.wait(timeout=timeout)
    return proc.returncode, b"".join(chunks), err


def _check(code: int, out: bytes, err: bytes, locale: str, expected: int = 0) -> None:
    text = (out + err).decode("utf-8", "replace")
    assert "Traceback" not in text and "internal error" not in text and "UnicodeEncodeError" not in text, text[-2000:]
    assert code == expected, text[-2000:]
    if locale in ("C", "POSIX"):
        bad = [bytes([b]) for b in out + err if b >= 0x80]
        assert not bad, f"non-ASCII bytes under LC_ALL={locale}: {text[-500:]}"


def test_to_ascii_spells_symbols_and_escapes_the_rest():
    assert to_ascii("· candidate — 5 ± 1 ≥ 2") == ". candidate - 5 +/- 1 >= 2"
    assert to_ascii("┏━┓┃└┘") == "+-+|++"
    assert to_ascii("class é 日") == "class \\xe9 \\u65e5"
    # a byte that did not decode (os.fsdecode's surrogate escape, a UTF-8 file name under LC_ALL=C) is that byte
    assert to_ascii("caf\udcc3\udca9.csv") == "caf\\xc3\\xa9.csv"
    assert to_ascii("plain") == "plain"


def test_ascii_stream_never_raises(tmp_path):
    path = tmp_path / "out.txt"
    with open(path, "w", encoding="ascii") as inner:
        stream = AsciiStream(inner)
        stream.write("· ünïcode ⠋ 日本\n")
        stream.flush()
    assert path.read_bytes().isascii()


def test_compile_help_under_the_c_locale(tmp_path):
    code, out, err = _run(["compile", "--help"], "C", "pipe", tmp_path)
    _check(code, out, err, "C")


@pytest.mark.slow
@pytest.mark.parametrize("locale", LOCALES)
@pytest.mark.parametrize("kind", STDOUT_KINDS)
def test_every_verb_help(locale, kind, tmp_path):
    """Every verb's help, each run as `python -m tinyproto VERB --help` runs, in one interpreter per locale and
    kind of stdout (the start-up is what a help costs; test_compile_help_under_the_c_locale starts its own)."""
    helps = [[verb, "--help"] if verb else ["--help"] for verb in [None, *VERBS]]
    for args, (code, out) in zip(helps, _run_many(helps, locale, kind, tmp_path)):
        _check(code, out, b"", locale)
        assert b"Usage:" in out, (args, out[-500:])
        assert f"{args[0]} [OPTIONS]".encode() in out or args == ["--help"], (args, out[:300])


@pytest.mark.slow
@pytest.mark.parametrize("locale", LOCALES)
@pytest.mark.parametrize("kind", STDOUT_KINDS)
def test_compile_and_boards_run(locale, kind, tmp_path):
    """compile, boards and a compile of a missing non-ASCII file, in one interpreter (MANY_RUNS; their stderr is
    checked there, together)."""
    runs = [["compile", "iris", "--budget", "1kB", "--out", str(tmp_path / "m")], ["boards"],
            ["compile", str(tmp_path / "missing-\u00e9.csv")]]
    (compiled, out), (boards, listed), (missing, said) = _run_many(runs, locale, kind, tmp_path)
    _check(compiled, out, b"", locale)
    assert b"int8 accuracy" in out
    _check(boards, listed, b"", locale)
    _check(missing, said, b"", locale, expected=1)  # a clear error, also when it names a non-ASCII file


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("kind", ["pty", "pipe"])
def test_every_verb_runs_under_the_c_locale(kind, tmp_path, compiled):
    """The loop a user runs, each verb once, under LC_ALL=C with Python's UTF-8 mode off. Its first step,
    `compile iris --budget 1kB`, is test_compile_and_boards_run[C-...] (the same command under C, this kind of
    stdout); the loop continues from the run's shared copy of that model (conftest's `compiled`). The verbs run one
    after another in one interpreter, as `python -m tinyproto VERB ...` runs each (MANY_RUNS: one start-up)."""
    import shutil

    model = str(tmp_path / "m")
    shutil.copytree(compiled("iris", "1kB"), model, symlinks=True)
    steps = [
        ["build", model],
        ["validate", model, "--sim"],
        ["export", model, "--arduino", "--out", str(tmp_path / "lib")],
        ["report", model],
        ["federate", "iris", "--parties", "2", "--backend", "local", "--out", str(tmp_path / "fed")],
        ["sweep", "iris", "--models", "flynn", "--budgets", "1kB", "--out", str(tmp_path / "sw"), "--device", "none",
         "--workers", "1"],
        ["boards"],
    ]
    for args, (code, out) in zip(steps, _run_many(steps, "C", kind, tmp_path)):  # its stderr: checked there
        assert code == 0, (args, out[-2000:])
        _check(code, out, b"", "C")


def test_a_stream_whose_reader_went_away_swallows_the_rest():
    """ReaderSafeStream (and AsciiStream) on a pipe whose reader closed: no BrokenPipeError, now or at the
    flush of what was buffered, and the descriptor writes to /dev/null from then on."""
    from tinyproto.core.terminal import ReaderSafeStream

    for wrap in (ReaderSafeStream, AsciiStream):
        read_end, write_end = os.pipe()
        os.close(read_end)
        inner = os.fdopen(write_end, "w", encoding="utf-8")
        stream = wrap(inner)
        assert stream.write("line — one\n") == len("line — one\n")
        stream.flush()
        stream.write("more\n" * 10000)
        stream.flush()
        assert os.path.realpath(f"/proc/self/fd/{write_end}") == os.devnull
        stream.close()


def _reader_gone(args: list[str], locale: str) -> subprocess.CompletedProcess:
    """`tinyproto ARGS | head -0`: stdout and stderr a pipe whose reader closed before the first line."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "tinyproto", *args], stdout=write_end, stderr=write_end,
                              env=_env(locale), timeout=600)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_a_reader_that_went_away_does_not_change_the_exit(locale):
    """`tinyproto boards | head -0` exits 0 (it exited 1, as for a user's error, having printed nothing)."""
    assert _reader_gone(["boards"], locale).returncode == 0


@pytest.mark.parametrize("closed", [">&-", "2>&-", "<&- >&- 2>&-"])
def test_a_closed_standard_stream_does_not_change_the_exit(tmp_path, closed):
    """`tinyproto boards >&-` exited 1 with a traceback after its work (Python leaves sys.stdout None and the exit
    flushed it), and a refusal with stderr closed still exits 1; the next file opened must not become fd 1."""
    script = ("import os, sys; from tinyproto.core.terminal import ascii_safe_stdio; ascii_safe_stdio(); "
              "f = open(sys.argv[1], 'w'); print('to stdout'); f.close(); os.write(1, b'raw')")
    cases = [([sys.executable, "-m", "tinyproto", "boards"], 0),
             ([sys.executable, "-m", "tinyproto", "compile", str(tmp_path / "missing.csv")], 1),
             ([sys.executable, "-c", script, str(tmp_path / "file.txt")], 0)]
    for command, code in cases:
        shell = " ".join(shlex.quote(word) for word in command) + " " + closed
        result = subprocess.run(["sh", "-c", shell], env=_env("C.UTF-8"), capture_output=True, timeout=600)
        assert result.returncode == code, (shell, result.stderr[-2000:])
        assert b"Traceback" not in result.stdout + result.stderr
    assert (tmp_path / "file.txt").read_text() == ""


def test_a_reader_that_went_away_leaves_validate_its_verdict(built_models):
    """`tinyproto validate DIR | head -1` of a device that passes exits 0 and writes its verdict (it exited 1, a
    failed validation's status, after a passed one); a failed check still exits 1."""
    model = built_models("iris", "1kB")
    (model / "validation.json").unlink()
    assert _reader_gone(["validate", str(model), "--no-raw"], "C.UTF-8").returncode == 0
    assert json.loads((model / "validation.json").read_text())["passed"] is True
    assert _reader_gone(["validate", str(model / "nothing-here")], "C.UTF-8").returncode == 1


def test_a_data_file_named_in_any_script_compiles_under_any_locale(tmp_path):
    """`compile café.csv` (no --out) under LC_ALL=C with Python's UTF-8 mode off: the default directory build/café
    (its name in UTF-8 on disk) and a generated header byte-identical to the one under a UTF-8 locale; then its build
    and its report. Each was an internal error (exit 70) or a failed build: the path, the header, PlatformIO's
    reading of the path and avr-size's output, and the report's HTML went through the locale's ASCII."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    rows = "\n".join(",".join(f"{v:g}" for v in row) + f",{int(t)}" for row, t in zip(iris.data, iris.target))
    headers = {}
    for locale in ("C", "C.UTF-8"):
        work = tmp_path / locale
        work.mkdir()
        (work / "café.csv").write_text("a,b,c,d,y\n" + rows + "\n", encoding="utf-8")
        result = subprocess.run([sys.executable, "-m", "tinyproto", "compile", "café.csv", "--budget", "1kB"],
                                cwd=work, env=_env(locale), capture_output=True, timeout=600)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        assert os.listdir(work / "build") == ["café"]
        headers[locale] = (work / "build" / "café" / "include" / "tinyproto_model.h").read_bytes()
    assert headers["C"] == headers["C.UTF-8"]
    for verb in ("build", "report"):  # PlatformIO and avr-size on that path, the report naming it, under C
        result = subprocess.run([sys.executable, "-m", "tinyproto", verb, "build/café"], cwd=tmp_path / "C",
                                env=_env("C"), capture_output=True, timeout=600)
        assert result.returncode == 0, (verb, result.stderr.decode(errors="replace"))
