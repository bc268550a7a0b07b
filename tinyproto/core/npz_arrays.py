"""Reading named arrays from an .npz archive, every fault said in words: the user's data file (`X`, `y`) and a model
directory's test_vectors.npz both read through `read_npz_arrays`.

numpy's own reader answers a damaged archive with whatever its layers raise (KeyError for a missing array,
BadZipFile, EOFError, zlib.error, ValueError for a short or pickled array): the callers printed the class's name
("test_vectors.npz is damaged (KeyError)"), which tells the user nothing. Here each array is read on its own, its
.npy header checked before its data is decompressed, and a fault becomes `NpzProblem` with what is missing or wrong
("it has no array 'scores' (arrays in it: X_raw, xq, y)"); the caller adds the file's name and what to do.
Layer: core.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from typing import BinaryIO

import numpy as np


class NpzProblem(ValueError):
    """What is wrong with an .npz archive, in words (without the file's name)."""


def read_npz_arrays(source: bytes | BinaryIO, keys: tuple[str, ...], max_values: int,
                    optional: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """The arrays `keys` of an .npz archive (bytes, or a seekable binary file), never unpickling anything; a key in
    `optional` may be absent. Raises NpzProblem naming the array and the fault."""
    handle = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    magic = handle.read(4)
    handle.seek(0)
    if not magic:
        raise NpzProblem("it is empty")
    if not magic.startswith(b"PK"):
        raise NpzProblem("it is not an .npz file (not a zip archive)")
    try:
        archive = zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, EOFError, OSError, ValueError):
        raise NpzProblem("it is not a complete .npz archive (cut short or overwritten)") from None
    with archive:
        members = {name[:-4]: name for name in archive.namelist() if name.endswith(".npy")}
        missing = [key for key in keys if key not in members and key not in optional]
        if missing:
            found = ", ".join(sorted(members)[:12]) or "none"
            raise NpzProblem(f"it has no array {', '.join(map(repr, missing))} (arrays in it: {found})")
        return {key: _read_member(archive, members[key], key, max_values) for key in keys if key in members}


def _read_member(archive: zipfile.ZipFile, member: str, key: str, max_values: int) -> np.ndarray:
    try:
        with archive.open(member) as handle:
            version = np.lib.format.read_magic(handle)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(handle)
            if dtype.hasobject:
                raise NpzProblem(f"its array {key!r} holds Python objects, which need pickle (never loaded)")
            if math.prod(shape) > max_values:
                raise NpzProblem(f"its array {key!r} has shape {shape}, more than {max_values:,} values")
        with archive.open(member) as handle:
            array = np.lib.format.read_array(handle, allow_pickle=False)
    except NpzProblem:
        raise
    except MemoryError:
        raise NpzProblem(f"its array {key!r} is too large to load into memory") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError):
        raise NpzProblem(f"its array {key!r} is damaged (its stored data is cut short or corrupt)") from None
    except (ValueError, TypeError, SyntaxError, KeyError, OverflowError):  # the header or the data's length
        raise NpzProblem(f"its array {key!r} is damaged (not a .npy array numpy can read back)") from None
    return array
