"""What tinyproto wrote in a directory, and so may replace: the manifest (`.tinyproto`: every path written, with
its sha256 where the content is fixed, and the outputs rewritten in place), the names of the lock and of scratch
directories, and the entries that are not tinyproto's.

The rules, in one place:
- tinyproto replaces a directory only if every entry in it is covered by its manifest and unchanged since
  tinyproto wrote it; anything else (the user's CSV, an edited source) makes it refuse, naming the entry.
- A replacement is prepared in a scratch directory beside the target and swapped in with one atomic rename,
  so a kill leaves either the old or the new directory, never half of one. Scratch directories of dead
  runs (their lock is free) are removed by the next run.
- Every command that writes a directory holds its lock; a second one is refused at once.
core/outdir.py enforces them (locks, pre-flight checks, the atomic swap). Layer: core.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.safe_io import MAX_JSON_BYTES, cannot_read, file_sha256, write_json
from tinyproto.core.strict_json import loads_unique_keys

MANIFEST = ".tinyproto"
LOCK = ".tinyproto.lock"
SCRATCH_PREFIX = ".tinyproto-tmp-"  # short and independent of --out's name, so any usable name works
NAME_MAX = 255
# Every entry a command (re)writes in place inside a directory tinyproto made (record_outputs): build's .pio and
# build.json, validate's journal and summary, learn's projects, report's page and figures, sweep's files. The
# manifest's `owned` list is honoured only for these, so an edited manifest cannot hand a user's file to tinyproto.
OWNED_NAMES = frozenset({".pio", "build.json", "validation.json", "validation.jsonl", ".validation.jsonl.new",
                         "learning", "learned", "learn.json", "report.html", ".report.html.tmp", "figures",
                         "sweep.json", "results.jsonl", ".results.jsonl.tmp", "points"})
# The owned names that are directories (the rest are files): a tree tinyproto fills. What sits at an owned name must
# be of its kind, and an owned tree holds only what tinyproto writes there (see foreign_entries): a directory the
# user put where build.json goes, or a note in figures/, is the user's, and replacing the directory would delete it.
OWNED_TREES = frozenset({".pio", "learning", "learned", "figures", "points"})
# The owned trees that hold outputs of their own, each written through an --out of its own (check_output_dir), and
# how deep below the directory that owns them such an output sits: learn's learned model (DIR/learned), a sweep's
# points (DIR/points/<id>). Any other --out inside a directory tinyproto wrote is refused.
NESTED_OUTPUTS = {"learned": 1, "points": 2}


def read_manifest(directory: Path) -> dict | None:
    path = directory / MANIFEST
    if not path.is_file() or path.is_symlink():
        return None
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            return None
        data = loads_unique_keys(path.read_text(encoding="utf-8"))
    except PermissionError as exc:  # there but unreadable: not "was not written by tinyproto"
        raise cannot_read(path, "the directory's tinyproto manifest", exc) from None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("written_by") != "tinyproto" or not isinstance(data.get("files"), dict):
        return None
    owned = data.get("owned", [])
    if not isinstance(owned, list) or not all(isinstance(name, str) for name in owned):
        return None
    return data


def write_manifest(directory: Path, made_by: str | None = None) -> None:
    """Record every file now under `directory` with its sha256 (called last when a directory is created), and the
    verb that made it (`made_by`: what a reader's "make it again" advice names, see modeldir.remake_advice)."""
    files = {}
    for path in sorted(Path(directory).rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_file() and not path.is_symlink() and rel not in (MANIFEST, LOCK):
            files[rel] = file_sha256(path)
    doc = {"written_by": "tinyproto", "version": 1, "files": files}
    if made_by:
        doc["made_by"] = made_by
    write_json(Path(directory) / MANIFEST, doc)


def record_outputs(directory: Path, *names: str) -> None:
    """Add entries tinyproto (re)writes in place to the manifest: a file whose content changes from run to run
    (build.json, validation.jsonl) or a whole tree (.pio, learning/): covered whatever its content."""
    unknown = set(names) - OWNED_NAMES
    if unknown:
        raise ValueError(f"record_outputs: {sorted(unknown)} missing from OWNED_NAMES")
    directory = Path(directory)
    for name in names:  # called by every writer before it writes: nothing is written through a planted link
        check_output_entry(directory / name)
    data = read_manifest(directory)
    if data is None:
        # no manifest (deleted, or damaged): nothing says tinyproto wrote what is at these names, so none is replaced
        # (report.html, build.json, validation.jsonl may be the user's); what is missing may still be written
        present = [name for name in names if os.path.lexists(directory / name)]
        if present:
            raise TinyprotoError(f"{directory} has no readable tinyproto manifest ({MANIFEST}), so its {present[0]} "
                                 "may not be tinyproto's: it is not replaced; move it away, nothing was written")
        return
    before = set(data.get("owned", []))
    written = data["files"]  # what tinyproto wrote when it made the directory
    for name in names:
        # an entry at a name tinyproto never claimed is the user's (a report.html or build.json of their own, put
        # there after compile): claiming it now would let this command overwrite it
        if name not in before and os.path.lexists(directory / name) and not (
                name in written or any(rel.startswith(name + "/") for rel in written)):
            raise TinyprotoError(f"{directory / name} was not written by tinyproto (its manifest {MANIFEST} does not "
                                 "list it), so it is not replaced; move it away, nothing was written")
    owned = before | set(names)
    if owned != before:
        write_json(directory / MANIFEST, {**data, "owned": sorted(owned)})


MAX_OUTPUT_ENTRIES = 100_000  # a tree of outputs larger than this is not one tinyproto wrote (.pio holds ~20)


def check_output_entry(path: Path) -> None:
    """Refuse to write `path` (an output tinyproto rewrites in place) when it, or anything inside it, is a symbolic
    link or a special file: someone else put it there, and writing would go through it to another file."""
    if not os.path.lexists(path):
        return
    tree = path.name in OWNED_TREES
    if not path.is_symlink() and (path.is_dir() != tree) and (path.is_dir() or path.is_file()):
        # (os.replace of a new file onto a directory failed naming the temporary file, and left it behind; a
        # directory's mkdir onto a file said only "File exists")
        found, wanted = ("a directory", "a file") if path.is_dir() else ("a file", "a directory")
        raise TinyprotoError(f"{path} is {found}, where tinyproto writes {wanted}; tinyproto did not make it and "
                             "will not replace it: move it away, nothing was written")
    entries = [path]
    if path.is_dir() and not path.is_symlink():
        for count, (folder, dirs, files) in enumerate(os.walk(path)):  # os.walk does not follow links
            if count > MAX_OUTPUT_ENTRIES:
                break
            entries.extend(Path(folder) / name for name in dirs + files)
    for entry in entries:
        try:
            mode = os.lstat(entry).st_mode
        except OSError:
            continue  # vanished meanwhile: nothing to write through
        if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
            raise TinyprotoError(f"{entry} is {kind}, where tinyproto writes its output; tinyproto did not make "
                                 "it and will not write through it: move it away, nothing was written")


def foreign_entries(directory: Path, limit: int = 3) -> list[str]:
    """Entries of `directory` that tinyproto did not write or that changed since it wrote them."""
    directory = Path(directory)
    data = read_manifest(directory)
    if data is None:
        entries = sorted(p.name for p in directory.iterdir())
        return entries[:limit] if entries else []
    files, owned = data["files"], set(data.get("owned", [])) & OWNED_NAMES
    foreign: list[str] = []

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            if len(foreign) >= limit:
                return
            rel = entry.relative_to(directory).as_posix()
            if rel in (MANIFEST, LOCK):
                continue
            if rel in owned:
                _owned_entry(entry, rel, rel in OWNED_TREES, foreign, limit)
            elif entry.is_symlink() or not (entry.is_dir() or entry.is_file()):
                foreign.append(rel)
            elif entry.is_dir():
                if not any(f.startswith(rel + "/") for f in files):
                    foreign.append(rel + "/")
                else:
                    walk(entry)
            elif rel not in files:
                foreign.append(rel)
            elif files[rel] != file_sha256(entry):
                foreign.append(f"{rel} (changed since tinyproto wrote it)")

    walk(directory)
    return foreign


# The top of learn's learning/ (the learning firmware's project, rewritten by every learn): name -> a directory?
_LEARNING_TOP = {"include": True, "lib": True, "src": True, ".pio": True, "platformio.ini": False,
                 "build.json": False, "eeprom.bin": False}
_LEARNING_TEMP = re.compile(r"\A\.build\.json\.[A-Za-z0-9_]{8}\.tmp\Z")  # a killed learn's write_json


def _owned_entry(entry: Path, rel: str, tree: bool, foreign: list[str], limit: int) -> None:
    """An entry at a name tinyproto rewrites in place: a regular file where it writes a file; where it writes a
    tree, a directory of regular files and directories laid out as tinyproto writes them: a directory holding a
    manifest (a sweep's point, the learned model) is checked by that manifest, learned/ must be one, points/
    holds directories only, figures/ PNG files only (and a killed report's temporary ones), learning/ the
    learning project's entries (each of its kind). Anything else there (a link, a directory in a file's place, the
    user's file in figures/) is foreign: tinyproto did not put it there."""
    try:
        mode = os.lstat(entry).st_mode
    except OSError:
        return  # vanished meanwhile
    kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode) else
            "a file" if stat.S_ISREG(mode) else "not a regular file")
    if not tree:
        if not stat.S_ISREG(mode):
            foreign.append(f"{rel} ({kind}, where tinyproto writes a file)")
        return
    if not stat.S_ISDIR(mode):
        foreign.append(f"{rel} ({kind}, where tinyproto writes a directory)")
        return
    if (entry / MANIFEST).is_file() and not (entry / MANIFEST).is_symlink():
        foreign.extend(f"{rel}/{name}" for name in foreign_entries(entry, limit - len(foreign)))
        return
    if rel == "learned":  # learn writes a model directory there, manifest included
        foreign.append(f"{rel}/ (not the model directory tinyproto writes there)")
        return
    for folder, dirs, names in os.walk(entry):  # does not follow links
        top = Path(folder) == entry
        for name in sorted(dirs + names):
            if len(foreign) >= limit:
                return
            path = Path(folder) / name
            inner = path.relative_to(entry.parent).as_posix()
            mode = os.lstat(path).st_mode
            is_dir, is_file = stat.S_ISDIR(mode), stat.S_ISREG(mode)
            if not (is_dir or is_file) or not _laid_out(rel, top, name, is_dir):
                foreign.append(inner + ("/" if is_dir else ""))
                if is_dir:
                    dirs.remove(name)
            elif is_dir and (path / MANIFEST).is_file() and not (path / MANIFEST).is_symlink():
                foreign.extend(f"{inner}/{name}" for name in foreign_entries(path, limit - len(foreign)))
                dirs.remove(name)  # its manifest spoke for it


def _laid_out(tree: str, top: bool, name: str, is_dir: bool) -> bool:
    """Whether tinyproto writes an entry of this name and kind there (inside owned tree `tree`; top: at its top)."""
    if tree == "figures":
        return top and not is_dir and name.endswith((".png", ".png.tmp"))
    if tree == "points" and top:
        return is_dir
    if tree == "learning" and top:
        return _LEARNING_TOP.get(name) == is_dir or (not is_dir and bool(_LEARNING_TEMP.match(name)))
    return True


# the verbs that make a model directory (the manifest's made_by) and how to make one again
REMAKE = {"compile": "run `tinyproto compile` again", "federate": "run `tinyproto federate` again",
          "export": "run `tinyproto export` again"}


def remake_advice(directory: Path) -> str:
    """What to run to make a model directory again, named for the command that made it: compile, federate (the
    manifest's made_by), learn (its learned/ model) or a sweep (one of its points). A damaged directory must not send
    the user to a command that never wrote it ("run tinyproto compile again" for a federated model)."""
    directory = Path(directory)
    try:
        made_by = (read_manifest(directory) or {}).get("made_by")
    except TinyprotoError:  # an unreadable manifest: decided from where the directory is
        made_by = None
    if made_by == "learn" or (made_by is None and directory.name == "learned"
                              and os.path.lexists(directory.parent / "learn.json")):
        return f"run `tinyproto learn {directory.parent}` again"
    if directory.parent.name == "points" and os.path.lexists(directory.parent.parent / "sweep.json"):
        return f"run the sweep again in a new --out (this is its point {directory.name})"
    if made_by is None and _federation_report(directory):  # written before the manifest recorded its verb
        made_by = "federate"
    return REMAKE.get(made_by, REMAKE["compile"])


def _federation_report(directory: Path) -> bool:
    """Whether the directory's report.json, if it can be read, is a federated model's (it has `parties`)."""
    from tinyproto.core.safe_io import read_json

    try:
        return "parties" in read_json(directory / "report.json", "the model's report")
    except (TinyprotoError, OSError):
        return False
