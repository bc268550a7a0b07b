#!/usr/bin/env python3
"""The executed examples of the documentation: find them, run them, compare them, and rewrite them.

    python tools/docs_examples.py --check     # run every marked example, list the lines that are stale
    python tools/docs_examples.py --update    # run them and write the real output into the pages

A page marks an executed example with a `<!-- run -->` comment right before a ```console block. In the block,
`$ command` lines are commands (a trailing `# comment` after two spaces is dropped; `tinyproto`, `pio`, `python`
and `.venv/bin/...` mean this virtualenv's), every other line is output that must appear in that command's real
output, in the same order (whitespace collapsed). A command whose comment says `(excerpt)` shows chosen lines;
any other shows its whole output (progress bars left out), so a line of the real output the page leaves out is
stale too. A command must succeed, unless its comment says
`(exits N)`: then it must exit with status N (a refusal the page shows, its one-line message compared). Lines
of `...` and lines drawn only of table borders are skipped; wall-clock seconds (`12.3 s`) are the one figure not
compared, because they depend on the machine.

All pages' commands run once, in page order, in one scratch directory (the own-CSV tutorial's wine.csv feeds
the later tutorials); a command shown on two pages runs once. tests/test_docs.py runs the check, one test per
group of PAGE_GROUPS, each in a directory of its own, so pytest-xdist's workers share the pages.

--update keeps an excerpt's choice of lines: a line whose text is unchanged but whose figures moved is replaced by
the new line (matched with its digits masked); a line it cannot match is kept and reported, for a person to fix.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# the pages whose examples are executed, in the order a reader meets them
EXECUTED_PAGES = ["README.md", "docs/getting-started.md", "docs/tutorials/own-csv.md",
                  "docs/tutorials/arduino-sketch.md", "docs/tutorials/two-models.md",
                  "docs/tutorials/learn-on-device.md",
                  "docs/tutorials/federated.md", "docs/tutorials/sweep-and-report.md"]
# The same pages in groups that can run apart, each in a scratch directory of its own: a page that uses the files
# of an earlier page's models is in that page's group (the Arduino sketch exports the own-CSV model), and a page
# that shows one command of another page is in its group (the README and getting started run the same quick
# start). The later tutorials only read the own-CSV tutorial's wine.csv: they make it first (`prerequisites`).
PAGE_GROUPS = [["README.md", "docs/getting-started.md"],
               ["docs/tutorials/own-csv.md", "docs/tutorials/arduino-sketch.md"],
               ["docs/tutorials/two-models.md"], ["docs/tutorials/learn-on-device.md"],
               ["docs/tutorials/federated.md"], ["docs/tutorials/sweep-and-report.md"]]
WINE_PAGE = "docs/tutorials/own-csv.md"  # its first command writes wine.csv

_BLOCK = re.compile(r"(<!-- run -->\s*\n)?```console\n(.*?)```", re.DOTALL)
_SECONDS = re.compile(r"\b\d+(?:\.\d+)?\s?s\b")
# The painted stack high-water mark is the deepest the stack went in that run: a receive interrupt that lands
# during an inference's deepest call adds its frame (about 10 B on digits), and where host bytes land depends on
# the host's timing. So the peak, and the SRAM margin derived from it, vary from run to run like wall seconds.
_STACK_PEAK = re.compile(r"\b(stack peak|margin) \d+ B\b")
_BORDER = re.compile(r"^[\s┌┐└┘├┤┬┴┼─━┏┓┗┛┡┩╇┃│┳┻╋]*$")
_PROGRESS = "━━"  # rich's progress bars: their counts and times are the terminal's, not results


def command_of(line: str) -> str:
    return re.split(r"\s{2,}#", line[2:])[0].strip()


def is_excerpt(line: str) -> bool:
    """A `$ command  # ... (excerpt)` line shows chosen lines of the output; any other command, all of them."""
    parts = re.split(r"\s{2,}#", line[2:], maxsplit=1)
    return len(parts) > 1 and "(excerpt)" in parts[1]


def exit_of(line: str) -> int:
    """The exit status a `$ command  # ... (exits N)` line must give: N, else 0."""
    parts = re.split(r"\s{2,}#", line[2:], maxsplit=1)
    found = re.search(r"\(exits (\d+)\)", parts[1]) if len(parts) > 1 else None
    return int(found.group(1)) if found else 0


class Step(NamedTuple):
    """One `$ command` of a console block: the lines shown under it, the exit status it must give, and whether
    the lines are an excerpt of its output or all of it."""

    command: str
    expected: list[str]
    exit_status: int
    excerpt: bool


def console_blocks(page: str) -> list[tuple[bool, list[Step]]]:
    """(marked to run, its steps) for every ```console block of a page."""
    blocks = []
    for match in _BLOCK.finditer((ROOT / page).read_text()):
        steps: list[Step] = []
        for line in match.group(2).splitlines():
            if line.startswith("$ "):
                steps.append(Step(command_of(line), [], exit_of(line), is_excerpt(line)))
            elif steps:
                steps[-1][1].append(line)
        blocks.append((match.group(1) is not None, steps))
    return blocks


def normalise(line: str) -> str:
    return " ".join(_STACK_PEAK.sub(r"\1 <bytes> B", _SECONDS.sub("<seconds>", line)).split())


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


def unshown_lines(expected: list[str], actual: str) -> list[str]:
    """Lines of a command's whole output (progress bars left out) that a page showing all of it leaves out."""
    return missing_lines(_whole_output(actual), "\n".join(expected))


def _shell_command(command: str) -> str:
    words = []
    for word in command.split(" "):  # the commands on the pages are simple: words split by spaces
        if word in ("tinyproto", "pio", "python"):
            word = str(VENV_BIN / word)
        elif word.startswith(".venv/bin/"):
            word = str(VENV_BIN / word[len(".venv/bin/"):])
        words.append(word)
    return " ".join(words)


def example_runner(work: Path) -> Callable[..., str]:
    """run(command, exit_status=0) -> its output, each distinct command run once, in `work`, with this virtualenv;
    a command that exits with another status than the page says raises."""
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}
    env.pop("FORCE_COLOR", None)
    outputs: dict[str, str] = {}

    def run(command: str, exit_status: int = 0) -> str:
        shell = _shell_command(command)  # `tinyproto ...` and `.venv/bin/tinyproto ...` are one command
        if shell not in outputs:
            result = subprocess.run(["bash", "-c", shell], cwd=work, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, timeout=1800, stdin=subprocess.DEVNULL,
                                    check=False)  # one stream: the order a terminal shows
            if result.returncode != exit_status:
                raise RuntimeError(f"`{command}` exited {result.returncode}, the page says {exit_status}:\n"
                                   f"{result.stdout[-3000:]}")
            # compared as printed: a reader's run names the files under the current directory relatively
            outputs[shell] = result.stdout
        return outputs[shell]

    return run


def page_commands(page: str) -> list[str]:
    """The commands of a page's executed examples, in page order."""
    return [step.command for marked, steps in console_blocks(page) if marked for step in steps]


def prerequisites(group: list[str]) -> list[str]:
    """Commands to run before a group's pages when the group runs on its own: the own-CSV tutorial's command that
    writes wine.csv, for a group that reads wine.csv without making it (its output is compared on its own page)."""
    commands = [command for page in group for command in page_commands(page)]
    if WINE_PAGE in group or not any("wine.csv" in command for command in commands):
        return []
    return page_commands(WINE_PAGE)[:1]


def stale_lines(run: Callable[..., str], pages: list[str] = EXECUTED_PAGES) -> list[str]:
    stale = []
    for page in pages:
        for marked, steps in console_blocks(page):
            for step in steps if marked else []:
                actual = run(step.command, step.exit_status)
                found = [("not in the output", line) for line in missing_lines(step.expected, actual)]
                if not step.excerpt:
                    found += [("in the output, not on the page", line) for line in unshown_lines(step.expected, actual)]
                if found:
                    stale.append(f"{page}: $ {step.command}" + "".join(f"\n  {what}: {line}" for what, line in found))
    return stale


# ---- --update ------------------------------------------------------------------------------------------------------

def _masked(line: str) -> str:
    return re.sub(r"\d+", "#", normalise(line))


def _updated_excerpt(expected: list[str], actual: str, unmatched: list[str]) -> list[str]:
    lines = actual.splitlines()
    out, position = [], 0
    for line in expected:
        if not comparable(line):
            out.append(line)
            continue
        exact = [i for i in range(position, len(lines)) if normalise(lines[i]) == normalise(line)]
        similar = [i for i in range(position, len(lines)) if _masked(lines[i]) == _masked(line)]
        found = (exact or similar)[:1]
        if found:
            position = found[0] + 1
            out.append(line if exact else lines[found[0]].rstrip())
        else:
            unmatched.append(line)
            out.append(line)
    return out


def _whole_output(actual: str) -> list[str]:
    lines = [line.rstrip() for line in actual.splitlines()
             if _PROGRESS not in line or line.lstrip()[:1] in "┏┡┗┌└├"]  # a table's border is not a progress bar
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def update_page(page: str, run: Callable[..., str], unmatched: list[str]) -> bool:
    path = ROOT / page
    text = path.read_text()

    def rewrite(match: re.Match) -> str:
        if match.group(1) is None:
            return match.group(0)
        out: list[str] = []
        step_lines: list[str] = []
        command_line = None

        def flush():
            if command_line is None:
                return
            actual = run(command_of(command_line), exit_of(command_line))
            excerpt = "(excerpt)" in command_line
            out.extend(_updated_excerpt(step_lines, actual, unmatched) if excerpt else _whole_output(actual))

        for line in match.group(2).splitlines():
            if line.startswith("$ "):
                flush()
                out.append(line)
                command_line, step_lines = line, []
            else:
                step_lines.append(line)
        flush()
        return f"{match.group(1)}```console\n" + "\n".join(out) + "\n```"

    new = _BLOCK.sub(rewrite, text)
    if new != text:
        path.write_text(new)
    return new != text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="write the real output into the pages")
    parser.add_argument("--check", action="store_true", help="list the stale lines (the default)")
    parser.add_argument("--pages", nargs="+", default=EXECUTED_PAGES, metavar="PAGE",
                        help="only these pages, in this order (a page may need an earlier one's files)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="docs-examples-") as work:
        run = example_runner(Path(work))
        for command in prerequisites(args.pages):  # e.g. wine.csv for a later tutorial run on its own
            run(command, 0)
        if args.update:
            unmatched: list[str] = []
            for page in args.pages:
                changed = update_page(page, run, unmatched)
                print(f"{page}: {'updated' if changed else 'unchanged'}", flush=True)
            for line in unmatched:
                print(f"not matched, fix by hand: {line}")
            sys.exit(1 if unmatched else 0)
        stale = stale_lines(run, args.pages)
        print("\n".join(stale) if stale else "every executed example matches a fresh run")
        sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
