"""Writing a directory safely: one command at a time (flock), refused before any work when unusable, replaced
with one atomic exchange so a kill leaves the old or the new directory, never half of one. The safety rules are
listed in tinyproto/core/manifest.py. Layer: core."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tinyproto.core.errors import TinyprotoError, no_space_hint, os_error_line
from tinyproto.core.manifest import (
    LOCK,
    MANIFEST,
    NAME_MAX,
    NESTED_OUTPUTS,
    SCRATCH_PREFIX,
    foreign_entries,
    read_manifest,
    write_manifest,
)


# ------------------------------------------------------------------------------------------------ locking


def _try_lock(lock_path: Path, verb: str) -> int | None:
    """An flock'ed descriptor on lock_path, or None when another live process holds it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO there: flock took it, ftruncate failed, the fd leaked
            raise OSError(errno.EINVAL, "not a regular file")  # holding the lock (locked names what it is)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {verb}\n".encode())
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)  # never left open, and so never left locked, after a failure (a full disk at the write)
        raise
    return fd


def _holder(lock_path: Path) -> str:
    """Who holds the lock, from what _try_lock wrote in it: read without blocking and only from a regular file (a
    FIFO at the lock's name blocked this read for ever)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "another tinyproto command"
            text = os.read(fd, 256).decode("utf-8", errors="replace")
        finally:
            os.close(fd)
        pid, _, verb = text.strip().partition(" ")
        return f"`tinyproto {verb[:40]}`, pid {pid[:12]}"
    except OSError:
        return "another tinyproto command"


LOCK_LINE = re.compile(rb"\A(\d{1,10} [\w-]{1,40}\n)?\Z")  # what _try_lock writes: "<pid> <verb>\n" (or nothing yet)


def _lock_held(lock_path: Path) -> bool | None:
    """Whether a live command holds the lock file tinyproto wrote at lock_path, probed with flock without creating
    or rewriting it; None when lock_path is not such a file (missing, a link, not a regular file, or content that
    is not what _try_lock writes: the user's file, left alone)."""
    try:
        if lock_path.is_symlink() or not lock_path.is_file() or lock_path.stat().st_size > 64 \
                or not LOCK_LINE.match(lock_path.read_bytes()):
            return None
        fd = _try_lock_quietly(lock_path)
    except OSError:
        return None
    if fd is None:
        return True
    os.close(fd)
    return False


def holds_only_a_dead_lock(directory: Path) -> bool:
    """True when `directory`'s one entry is a lock file tinyproto wrote whose holder is gone (a run killed between
    creating the directory and writing into it): such a directory is as good as empty. The lock is probed with
    flock, not by pid, so a live holder (even one that reused the pid) keeps it in use."""
    lock_path = _sole_lock(Path(directory))
    return lock_path is not None and _lock_held(lock_path) is False


def _check_lock_held(directory: Path) -> None:
    """A directory whose tinyproto lock a live command holds is being written by another run (it may be creating
    its first files right now, under temporary names): say so, not 'foreign'."""
    lock_path = directory / LOCK
    if _lock_held(lock_path):
        raise TinyprotoError(f"{directory} is in use by {_holder(lock_path)}; wait for it to finish")


def _sole_lock(directory: Path) -> Path | None:
    """The lock file when it is `directory`'s only entry and a regular file (not a link), else None."""
    lock_path = directory / LOCK
    try:
        if [p.name for p in directory.iterdir()] != [LOCK] or lock_path.is_symlink() or not lock_path.is_file():
            return None
    except OSError:
        return None
    return lock_path


def _try_lock_quietly(lock_path: Path) -> int | None:
    """flock lock_path without creating or rewriting it; None when a live process holds it."""
    fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _special(path: Path) -> str | None:
    """What kind of special file is at `path` (a FIFO at the lock's name said only "Invalid argument"), or None."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device")):
        if test(mode):
            return what
    return None


@contextmanager
def locked(directory: Path, verb: str) -> Iterator[None]:
    """Hold the model directory's lock while `verb` writes into it; refuse at once if another command has it."""
    directory = Path(directory)
    lock_path = directory / LOCK
    try:
        fd = _try_lock(lock_path, verb)
    except OSError as exc:
        # a link or a directory at the lock's name said only "Too many levels of symbolic links" / "Is a directory"
        what = {errno.ELOOP: "a symbolic link", errno.EISDIR: "a directory"}.get(exc.errno) or _special(lock_path)
        if what is not None:
            raise TinyprotoError(f"cannot lock {directory} for writing: {lock_path} is {what}, not the lock file "
                                 "tinyproto makes; move it away") from None
        raise TinyprotoError(f"cannot lock {directory} for writing: {os_error_line(exc)}") from None
    if fd is None:
        raise TinyprotoError(f"{directory} is in use by {_holder(lock_path)}; wait for it to finish")
    try:
        if os.fstat(fd).st_ino != os.stat(lock_path).st_ino:  # replaced by a compile while we waited
            raise TinyprotoError(f"{directory} was replaced while opening it; run the command again")
        _remove_leftovers(directory)  # ours to remove: we hold the lock every writer of this directory takes
        remove_stale_scratch(directory.parent)  # a killed compile's scratch beside it, as tidy does: any verb
        yield
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------ leftovers
#
# What a run of tinyproto killed with SIGKILL (or stopped by power loss) can leave behind, and who removes it:
# - a temporary file of write_json (".<name>.XXXXXXXX.tmp" beside validation.json, build.json, learn.json,
#   sweep.json or the manifest): removed by the next command that takes the directory's lock (every writer
#   does, `locked`), or that checks the directory (`tidy`: compile --out, export, report), when the lock is
#   free, so no live writer can be mid-write;
# - a scratch directory ".tinyproto-tmp-*" beside the output: removed by the next command that writes there or
#   that writes into or checks a directory beside it (`locked`, `tidy`: build, validate, learn, export, ...), when
#   its lock is free, or when it is empty (killed before its lock was made; a live creator whose directory is
#   removed under it makes another, see _new_scratch).
# Only these names, only in a directory tinyproto wrote (a manifest), never anything else.

_JSON_TEMP = re.compile(r"\A\.(validation\.json|build\.json|learn\.json|sweep\.json|model\.json|report\.json|"
                        r"\.tinyproto|export\.json)\.[A-Za-z0-9_]{8}\.tmp\Z")


def is_leftover_name(name: str) -> bool:
    """A name only a killed tinyproto writer leaves (write_json's temporary file)."""
    return bool(_JSON_TEMP.match(name))


def _remove_leftovers(directory: Path) -> None:
    """Remove write_json temporary files a killed run left in `directory` (the caller holds its lock)."""
    if read_manifest(directory) is None:
        return  # not a directory tinyproto wrote: nothing in it is ours to remove
    try:
        names = [p.name for p in directory.iterdir() if is_leftover_name(p.name)]
    except OSError:
        return
    for name in names:
        path = directory / name
        try:
            if not path.is_symlink() and path.is_file():
                path.unlink()
        except OSError:
            pass


def tidy(directory: Path) -> None:
    """Remove what killed runs of tinyproto left in and beside `directory` (a model or sweep directory), when no
    live command holds its lock; a directory tinyproto did not write is not touched."""
    directory = Path(directory)
    remove_stale_scratch(directory.parent)
    lock_path = directory / LOCK
    if read_manifest(directory) is None or lock_path.is_symlink() or (lock_path.exists() and not lock_path.is_file()):
        return
    try:
        fd = _try_lock(lock_path, "tidy")  # tinyproto's own lock name (made if missing): every writer takes it
    except OSError:
        return  # read-only, or not ours to lock: leave it
    if fd is None:
        return  # a live command is at work in it: what looks left over may be its
    try:
        _remove_leftovers(directory)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------ replacing


# The other kinds of output tinyproto writes, by the file that marks each: a model directory replaces none of them
# (compile --out on a sweep's directory replaced its results, hours of points, with a model).
OTHER_KINDS = {"sweep.json": "a sweep directory (tinyproto sweep)", "export.json": "an Arduino library export"}


def check_model_output_dir(out: Path) -> Path:
    """check_output_dir, and never another kind of tinyproto's output (a sweep, an export): compile, federate."""
    out = check_output_dir(out)
    for name, what in OTHER_KINDS.items():
        if os.path.lexists(out / name):
            raise TinyprotoError(f"--out {out} is {what}, not a model directory; choose another --out, nothing "
                                 "was changed")
    return out


def check_output_dir(out: Path) -> Path:
    """Refuse an --out that could not be written, before any training: returns the absolute path."""
    out = Path(os.path.abspath(out))
    if len(os.fsencode(out.name)) > NAME_MAX:
        raise TinyprotoError(f"--out name is {len(os.fsencode(out.name))} bytes long; "
                             f"file names are limited to {NAME_MAX}")
    ancestor = out.parent if out.exists() else _existing_ancestor(out)  # a file on the way is named first: it is
    # why nothing can be made there, wherever it is
    _check_not_inside_an_output(out)
    if out.is_symlink():
        raise TinyprotoError(f"--out {out} is a symbolic link; give the directory itself")
    if out.exists():
        if not out.is_dir():
            raise TinyprotoError(f"--out {out} exists and is not a directory; choose another --out")
        _check_replaceable(out)
        _check_not_in_use(out)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise TinyprotoError(f"cannot write --out {out}: {ancestor} is not writable")
    _probe_writable(ancestor, out)
    return out


def _existing_ancestor(out: Path) -> Path:
    """The nearest directory above an --out that does not exist yet (where it will be made); refused if that nearest
    existing entry is a file, or a link on the way is broken."""
    ancestor = out.parent
    while not ancestor.exists():
        if ancestor.is_symlink():  # a dangling link on the way
            raise TinyprotoError(f"cannot create {out}: {ancestor} is a broken symbolic link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise TinyprotoError(f"cannot create {out}: {ancestor} is not a directory")
    return ancestor


def _check_not_inside_an_output(out: Path) -> None:
    """Refuse an --out inside a directory tinyproto wrote (the nearest one above it with a manifest): `compile --out
    m/sub` wrote a model into model directory m, whose next compile then refused m (an entry its manifest does not
    list), and one under m/.pio or a sweep's figures/ is deleted by the next build or report. Only the outputs a
    directory owns for that purpose may be there (NESTED_OUTPUTS: learn's DIR/learned, a sweep's DIR/points/<id>)."""
    for ancestor in out.parents:
        if not os.path.lexists(ancestor / MANIFEST):
            continue
        try:
            owned = set((read_manifest(ancestor) or {}).get("owned", []))
        except TinyprotoError:  # its manifest cannot be read: still a directory tinyproto wrote
            owned = set()
        rel = out.relative_to(ancestor).parts
        if rel[0] in owned and len(rel) == NESTED_OUTPUTS.get(rel[0]):
            return
        raise TinyprotoError(f"--out {out} is inside {ancestor}, a directory tinyproto wrote (its next command "
                             "would refuse or replace what is put there); choose a directory outside it, nothing was "
                             "changed")


def _probe_writable(folder: Path, out: Path) -> None:
    """Create and remove a scratch directory where the output will be prepared: access() says yes to root on a
    read-only mount, /proc or /sys, and the refusal must come before training, not after it."""
    probe = None
    try:
        probe = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=folder)
    except OSError as exc:
        # (mkdir in /proc says "No such file or directory" of a /proc that exists: say what was tried)
        raise TinyprotoError(f"cannot write --out {out}: a directory cannot be created in {folder} "
                             f"({exc.strerror}){no_space_hint(exc) or '; choose another --out'}") from None
    finally:
        if probe is not None:
            try:
                os.rmdir(probe)
            except FileNotFoundError:
                pass  # another run's cleanup took it (an empty scratch directory): the probe still showed writable


def _check_replaceable(out: Path, we_hold_the_lock: bool = False) -> None:
    tidy(out)
    try:
        if not any(out.iterdir()) or holds_only_a_dead_lock(out):
            return
        if not we_hold_the_lock:
            _check_lock_held(out)
        foreign = foreign_entries(out)
    except PermissionError:
        raise TinyprotoError(f"--out {out} cannot be read (permission denied); choose another --out") from None
    if foreign:
        if read_manifest(out) is None:
            raise TinyprotoError(f"--out {out} is not empty and was not written by tinyproto (it holds "
                                 f"{', '.join(foreign)}); choose another --out, nothing was changed")
        raise TinyprotoError(f"--out {out} holds files tinyproto did not write ({', '.join(foreign)}); "
                             "choose another --out or move them away, nothing was changed")


def _check_not_in_use(directory: Path) -> None:
    """Refuse now, not after training, if another command holds the directory's lock."""
    lock_path = directory / LOCK
    if not lock_path.is_file() or lock_path.is_symlink():
        return
    try:
        fd = _try_lock(lock_path, "check")
    except OSError:
        return  # not lockable here: the real attempt at the end will say why
    if fd is None:
        raise TinyprotoError(f"{directory} is in use by {_holder(lock_path)}; wait for it to finish")
    os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(a))


def remove_stale_scratch(parent: Path, prefix: str = SCRATCH_PREFIX) -> None:
    """Delete scratch directories that killed runs left in `parent` (their lock is no longer held)."""
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return
    for scratch in candidates:
        lock_path = scratch / LOCK
        try:
            if scratch.is_symlink() or not scratch.is_dir():
                continue
            has_lock = lock_path.is_file()
        except OSError:  # another user's scratch in a shared /tmp (mkdtemp makes it private): not ours to remove
            continue
        if not has_lock:
            try:
                scratch.rmdir()  # empty: killed before it locked it (rmdir refuses a directory with anything in it)
            except OSError:
                pass
            continue
        try:
            fd = _try_lock(lock_path, "cleanup")
        except OSError:
            continue
        if fd is not None:
            try:
                shutil.rmtree(scratch, ignore_errors=True)
            finally:
                os.close(fd)


@contextmanager
def private_scratch(prefix: str) -> Iterator[Path]:
    """A locked temporary directory for helper processes' files (dask workers'), removed on exit. A run killed
    with SIGKILL cannot remove its own: the next run removes every one whose lock no longer has a holder."""
    parent = Path(tempfile.gettempdir())
    remove_stale_scratch(parent, prefix)
    path, fd = _new_scratch(parent, "scratch", prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


@contextmanager
def atomic_directory(out: Path, verb: str = "compile") -> Iterator[Path]:
    """Yield a scratch directory that replaces `out` only if the block succeeds: no half-written output.

    `out` may be missing, empty, or a directory tinyproto wrote and nobody changed since (see the module doc).
    """
    out = check_output_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_scratch(out.parent)
    scratch, fd = None, None
    try:
        scratch, fd = _new_scratch(out.parent, verb)  # held across the swap: the new directory is born locked
        scratch.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary directory
        yield scratch
        write_manifest(scratch, verb)
        _swap_in(scratch, out, verb)
    except BaseException as exc:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
            if isinstance(exc, OSError):
                _name_in_output(exc, scratch, out)
        raise
    finally:
        if fd is not None:
            os.close(fd)


def _name_in_output(exc: OSError, scratch: Path, out: Path) -> None:
    """A write into the scratch directory that failed (a full disk) names the file of the output it was for: the
    scratch is gone once the error is printed, and a failed write() or close() names no file at all."""
    if not exc.filename:
        exc.filename = str(out)
        return
    for attribute in ("filename", "filename2"):
        name = getattr(exc, attribute)
        if isinstance(name, str) and (name == str(scratch) or name.startswith(f"{scratch}{os.sep}")):
            setattr(exc, attribute, str(out) + name[len(str(scratch)):])


def _new_scratch(parent: Path, verb: str, prefix: str = SCRATCH_PREFIX) -> tuple[Path, int]:
    """A new scratch directory in `parent` with its lock held. Between mkdtemp and the lock another run's
    cleanup may take it for a killed run's empty scratch and remove it: then make another."""
    for _ in range(100):
        scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        try:
            fd = _try_lock(scratch / LOCK, verb)
        except FileNotFoundError:
            continue
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        if fd is not None:
            return scratch, fd
    raise TinyprotoError(f"cannot make a scratch directory in {parent}: another process keeps removing them")


def _swap_in(scratch: Path, out: Path, verb: str) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise TinyprotoError(f"--out {out} changed while training (it is no longer a directory); nothing written")
    if not out.exists():
        try:
            os.rename(scratch, out)  # fails if a directory appeared there meanwhile: then replace it as below
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if read_manifest(out) is None:
        # not a directory tinyproto wrote: only an empty one may be used, and it is filled in place (the user
        # may be in it: `--out .`); nothing of ours goes in (not even a lock) unless it is empty
        _fill_empty(scratch, out)
        return
    with locked(out, verb):
        _check_replaceable(out, we_hold_the_lock=True)  # again: the user may have added a file while we trained
        if _exchange(scratch, out):
            old = scratch  # the old directory now sits at the scratch name
        else:
            old = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=out.parent))
            os.replace(out, old)
            os.replace(scratch, out)
    shutil.rmtree(old, ignore_errors=True)


def _rename_noreplace(source: Path, target: Path) -> None:
    """rename() that never replaces an existing target (renameat2 RENAME_NOREPLACE; a check where missing)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        AT_FDCWD, RENAME_NOREPLACE = -100, 1
        if renameat2(AT_FDCWD, os.fsencode(source), AT_FDCWD, os.fsencode(target), RENAME_NOREPLACE) == 0:
            return
        if ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(target))
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, "File exists", str(target))
    os.rename(source, target)


def _fill_empty(scratch: Path, out: Path) -> None:
    """Move the scratch directory's entries into the existing empty directory `out`, keeping its inode (a shell
    whose working directory it is still sees the result). The lock goes first (still held by us), then the
    manifest, so a kill half-way leaves a directory tinyproto owns and the next compile replaces it."""
    try:
        if holds_only_a_dead_lock(out):
            (out / LOCK).unlink()  # tinyproto's own, its holder gone: ours comes in its place below
        if any(out.iterdir()):
            raise TinyprotoError(f"--out {out} is not empty and was not written by tinyproto (it holds "
                                 f"{', '.join(sorted(p.name for p in out.iterdir())[:3])}); choose another --out, "
                                 "nothing was changed")
    except PermissionError:
        raise TinyprotoError(f"--out {out} cannot be read (permission denied); choose another --out") from None
    names = [LOCK, MANIFEST] + sorted(p.name for p in scratch.iterdir() if p.name not in (LOCK, MANIFEST))
    moved: list[str] = []
    try:
        for name in names:
            _rename_noreplace(scratch / name, out / name)
            moved.append(name)
    except BaseException:
        for name in reversed(moved):  # give the directory back as it was: empty
            try:
                os.rename(out / name, scratch / name)
            except OSError:
                pass
        raise
    scratch.rmdir()
