"""The documentation stays true: the site builds with warnings as errors (links checked), the README keeps its
shape, and every command a page shows WITH its output is run again and its output compared line by line.

How a page marks an executed example: a `<!-- run -->` comment right before a ```console block. In the block,
`$ command` lines are commands (a trailing `# comment` after two spaces is dropped, `tinyproto`, `pio` and
`.venv/bin/...` mean the test's own virtualenv), every other line is output that must appear in that command's
real output, in the same order (whitespace collapsed; a line may be an excerpt of the output, never a paraphrase).
Lines of `...`, and lines drawn only of table borders, are skipped; wall-clock seconds (`12.3 s`) are the one
figure not compared, because they depend on the machine. Every byte count, accuracy, cycle count and millisecond
figure is compared, so a stale figure fails.

All pages' commands run once, in page order, in one scratch directory (a page may use what an earlier one made:
the own-CSV tutorial's wine.csv feeds the later tutorials); a command shown on two pages runs once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
VENV_BIN = Path(sys.executable).parent
# the pages whose examples are executed, in the order a reader meets them
EXECUTED_PAGES = ["README.md", "docs/getting-started.md", "docs/tutorials/own-csv.md",
                  "docs/tutorials/arduino-sketch.md", "docs/tutorials/learn-on-device.md",
                  "docs/tutorials/federated.md", "docs/tutorials/sweep-and-report.md"]
# every page where a console block showing output must be executed
MUST_RUN = ["README.md", "docs/getting-started.md", "docs/tutorials/*.md"]
SETUP_LINES = ("bash tools/setup.sh && .venv/bin/tinyproto run --budget 2kB",
               "bash tools/setup.sh && .venv/bin/python -m pytest -q")

_BLOCK = re.compile(r"(<!-- run -->\s*\n)?```console\n(.*?)```", re.DOTALL)
_SECONDS = re.compile(r"\b\d+(?:\.\d+)?\s?s\b")
_BORDER = re.compile(r"^[\s┌┐└┘├┤┬┴┼─━┏┓┗┛┡┩╇┃│┳┻╋]*$")


# ---- parsing -----------------------------------------------------------------------------------------------------

def console_blocks(page: str) -> list[tuple[bool, list[tuple[str, list[str]]]]]:
    """(marked to run, [(command, expected output lines)]) for every ```console block of a page."""
    blocks = []
    for match in _BLOCK.finditer((ROOT / page).read_text()):
        steps: list[tuple[str, list[str]]] = []
        for line in match.group(2).splitlines():
            if line.startswith("$ "):
                steps.append((re.split(r"\s{2,}#", line[2:])[0].strip(), []))
            elif steps:
                steps[-1][1].append(line)
        blocks.append((match.group(1) is not None, steps))
    return blocks


def normalise(line: str) -> str:
    return " ".join(_SECONDS.sub("<seconds>", line).split())


def comparable(line: str) -> bool:
    return bool(line.strip()) and line.strip() not in ("...", "…") and not _BORDER.match(line)


def missing_lines(expected: list[str], actual: str) -> list[str]:
    """Expected lines not found in the actual output in order (an empty list: the page is true)."""
    actual_lines = [normalise(line) for line in actual.splitlines()]
    missing, position = [], 0
    for line in (normalise(e) for e in expected if comparable(e)):
        try:
            position = actual_lines.index(line, position) + 1
        except ValueError:
            missing.append(line)
    return missing


def _pages(patterns: list[str]) -> list[str]:
    found: list[str] = []
    for pattern in patterns:
        found += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))
    return found


# ---- fast checks ------------------------------------------------------------------------------------------------

def test_normalise_masks_wall_seconds_only():
    assert normalise("search time │ 81.52 s (12 candidates)") == normalise("search time │ 5.48 s (12 candidates)")
    assert normalise("latency 1.366 ms at 16 MHz") != normalise("latency 1.367 ms at 16 MHz")
    assert missing_lines(["│ total │ 2048 │"], "a\n│  total  │  2048  │\n") == []
    assert missing_lines(["│ total │ 2047 │"], "│ total │ 2048 │\n") == ["│ total │ 2047 │"]
    assert missing_lines(["b", "a"], "a\nb\n") == ["a"]  # order matters


def test_readme_is_short_and_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    first_block = readme.split("```")[1]
    assert [line for line in first_block.splitlines() if line.strip()] == list(SETUP_LINES)
    ci = (ROOT / ".ci" / "run").read_text()
    assert SETUP_LINES[1] in ci  # CI runs the README's test command


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert targets
    for target in targets:
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_no_session_history_in_the_docs():
    pattern = re.compile(r"\bsession \d|\bissue \d+|\bload average|known gaps", re.IGNORECASE)
    for page in ["README.md", *_pages(["docs/**/*.md"])]:
        for number, line in enumerate((ROOT / page).read_text().splitlines(), 1):
            assert not pattern.search(line), f"{page}:{number}: {line.strip()}"


@pytest.mark.parametrize("page", _pages(MUST_RUN))
def test_every_example_with_output_is_executed(page):
    for marked, steps in console_blocks(page):
        shows_output = any(any(comparable(line) for line in out) for _, out in steps)
        assert marked or not shows_output, f"{page}: a console block shows output but has no <!-- run --> marker"
        if marked:
            assert page in EXECUTED_PAGES, f"{page} has executed examples: add it to EXECUTED_PAGES"


def test_site_builds_strict(tmp_path):
    """mkdocs build --strict: a broken internal link or anchor, a page missing from the nav, a generated
    reference page that fails: every warning is an error."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    site = tmp_path / "site"
    cli = (site / "reference" / "cli.html").read_text()
    assert "tinyproto compile" in cli and "--budget" in cli  # generated from the click commands
    assert "tp_predict" in (site / "reference" / "c-api.html").read_text()  # generated from firmware/tinyproto.h
    assert "fit_under_budget" in (site / "reference" / "python-api.html").read_text()  # from the docstrings


# ---- the executed examples ----------------------------------------------------------------------------------------

def _shell_command(command: str) -> str:
    words = []
    for word in command.split(" "):  # the commands on the pages are simple: words split by spaces
        if word in ("tinyproto", "pio", "python"):
            word = str(VENV_BIN / word)
        elif word.startswith(".venv/bin/"):
            word = str(VENV_BIN / word[len(".venv/bin/"):])
        words.append(word)
    return " ".join(words)


@pytest.fixture(scope="module")
def run_examples(tmp_path_factory):
    work = tmp_path_factory.mktemp("docs-examples")
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}
    env.pop("FORCE_COLOR", None)
    outputs: dict[str, str] = {}

    def run(command: str) -> str:
        shell = _shell_command(command)  # `tinyproto ...` and `.venv/bin/tinyproto ...` are one command
        if shell not in outputs:
            result = subprocess.run(["bash", "-c", shell], cwd=work, env=env, capture_output=True, text=True,
                                    timeout=1800, stdin=subprocess.DEVNULL, check=False)
            assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
            outputs[shell] = result.stdout + result.stderr
        return outputs[shell]

    run.work = work
    return run


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("page", EXECUTED_PAGES)
def test_page_examples_match_a_fresh_run(page, run_examples):
    # pages run in EXECUTED_PAGES order (pytest keeps parametrize order; -p no:randomly not needed: each page
    # runs the earlier pages' commands first, through the cache, when it is run alone or out of order)
    for earlier in EXECUTED_PAGES[:EXECUTED_PAGES.index(page)]:
        for marked, steps in console_blocks(earlier):
            for command, _ in steps if marked else []:
                run_examples(command)
    stale = []
    for marked, steps in console_blocks(page):
        if not marked:
            continue
        for command, expected in steps:
            missing = missing_lines(expected, run_examples(command))
            if missing:
                stale.append(f"$ {command}\n  not in the output: " + "\n  not in the output: ".join(missing))
    assert not stale, f"{page} is stale:\n" + "\n".join(stale)


def documented_keys(section: str) -> set[str]:
    """The keys in the first column of the table under `## <section>` of the file-formats page."""
    text = (DOCS / "reference" / "file-formats.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for line in body.splitlines():
        if line.startswith("| `"):
            keys |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("section, file", [("model.json", "model.json"), ("report.json", "report.json"),
                                           ("build.json", "build.json"), ("validation.json", "validation.json"),
                                           ("The manifest (.tinyproto)", ".tinyproto")])
def test_file_formats_page_lists_every_key(section, file, run_examples):
    """The keys the reference lists are exactly the top-level keys of a model directory a tutorial made."""
    for marked, steps in console_blocks("docs/tutorials/own-csv.md"):
        for command, _ in steps if marked else []:
            run_examples(command)
    actual = set(json.loads((run_examples.work / "build" / "wine" / file).read_text()))
    assert documented_keys(section) == actual
