"""The DATA of ``smoe sculpt MODEL OUT --calibrate DATA``: token ids for the model's forward
pass, read and checked before any layer runs.

The kind is told by the extension:

* ``.npy``: a numpy array of integer token ids, 1-D or 2-D. Its header is parsed and checked
  against the file size before numpy maps the data (``allow_pickle=False``, read-only);
* ``.safetensors``: a tensor ``input_ids`` of an integer dtype, 1-D or 2-D; the header is
  read and checked by :func:`smoe.interop.safetensors_io.read_header` (bounded reads, every
  tensor inside the file), then the one tensor is read with positioned reads;
* anything else: UTF-8 text (a leading byte-order mark dropped), tokenised whole by the
  checkpoint's own tokenizer (``transformers.AutoTokenizer`` on MODEL_DIR, local files
  only, no remote code), without special tokens: the ids of the model's own vocabulary,
  not of some other one.

2-D ids are the sequences as given. 1-D ids (text included) are cut into consecutive
windows of ``seq_len`` tokens; a shorter remainder is dropped, unless it is the only window.
``max_tokens`` keeps the first whole sequences that fit (at least one).

Every id of the file must lie in ``0..vocab_size-1``: a forward pass indexes the embedding
with it, and an id from another tokenizer would index past it (or, worse, silently
calibrate on the wrong rows). The first id outside is named by its position. The file is
hashed whole, so the manifest pins what the vault was calibrated on. Inputs are opened as
:func:`smoe.plumbing.fileio.open_input` does (a FIFO, a folder or a device is refused
without blocking), and nothing is allocated by a size the file claims before the claim is
checked against the file's size, itself at most :data:`MAX_BYTES`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import math
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smoe.errors import MissingExtra, RefusedInput, SmoeError, UnreadableInput, UsageError
from smoe.interop.safetensors_io import read_header
from smoe.plumbing import fileio

__all__ = ["MAX_BYTES", "TOKENIZER_FILES", "CalibrationData", "load_calibration"]

MAX_BYTES = 4 << 30
"""The largest DATA file read (4 GiB): far beyond any calibration set (a few million
tokens), small enough that reading it whole, or its ids as int64, fits in memory."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "tokenizer.tiktoken",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
"""Files one of which a checkpoint folder holds when it ships a tokenizer."""

# safetensors integer dtypes -> the numpy dtype of their (little-endian) bytes
_INT_DTYPES = {
    "I8": "<i1",
    "I16": "<i2",
    "I32": "<i4",
    "I64": "<i8",
    "U8": "<u1",
    "U16": "<u2",
    "U32": "<u4",
    "U64": "<u8",
}
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEAD = 16384  # magic, version, length and a header up to numpy's limit (10000 bytes)
_HASH_CHUNK = 8 << 20
_SCAN_CHUNK = 1 << 20  # ids range-checked at a time (a bool mask of this many bytes)
_NAMES_SHOWN = 5


@dataclass(frozen=True, eq=False)  # eq=False: ndarray fields make == ambiguous
class CalibrationData:
    """The calibration token ids, ``int64 [sequences, seq_len]`` (C order, our own copy),
    and what the manifest records about the file they came from.

    >>> import tempfile
    >>> npy = Path(tempfile.mkdtemp()) / "ids.npy"
    >>> np.save(npy, np.arange(10, dtype=np.int32))
    >>> data = load_calibration(npy, vocab_size=32, model_dir=".", seq_len=4)
    >>> data.format, data.size, data.ids.dtype, data.ids.tolist()
    ('npy', 168, dtype('int64'), [[0, 1, 2, 3], [4, 5, 6, 7]])
    """

    path: Path
    format: str  # "text", "npy" or "safetensors"
    sha256: str  # of the file's bytes
    size: int  # file bytes
    ids: np.ndarray  # int64, C-contiguous, [sequences, seq_len]

    @property
    def tokens(self) -> int:
        """How many tokens the forward passes see (``sequences * seq_len``).

        >>> CalibrationData(Path("d.npy"), "npy", "", 0, np.zeros((3, 4), np.int64)).tokens
        12
        """
        return int(self.ids.size)

    def record(self) -> dict[str, Any]:
        """The manifest's record of the DATA (JSON-safe: plain str and int).

        >>> rec = CalibrationData(Path("x/d.npy"), "npy", "ab", 144, np.zeros((2, 8))).record()
        >>> rec["file"], rec["bytes"], rec["sequences"], rec["seq_len"], rec["tokens"]
        ('d.npy', 144, 2, 8, 16)
        """
        rows, cols = self.ids.shape
        return {
            "file": self.path.name,
            "format": self.format,
            "bytes": int(self.size),
            "sha256": self.sha256,
            "sequences": int(rows),
            "seq_len": int(cols),
            "tokens": self.tokens,
        }


def load_calibration(
    path: str | Path,
    *,
    vocab_size: int,
    model_dir: str | Path,
    seq_len: int = 512,
    max_tokens: int | None = None,
) -> CalibrationData:
    """Read, check and shape the DATA at ``path`` (module docstring); every refusal is one
    line starting with the path.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> np.save(d / "ids.npy", np.arange(11, dtype=np.uint16))
    >>> load_calibration(d / "ids.npy", vocab_size=16, model_dir=d, seq_len=5).ids.shape
    (2, 5)
    >>> np.save(d / "big.npy", np.array([[1, 2], [3, 40]]))
    >>> load_calibration(d / "big.npy", vocab_size=16, model_dir=d)
    Traceback (most recent call last):
    smoe.errors.RefusedInput: /.../big.npy: token id 40 at [1, 1] is out of range: ids ...
    >>> _ = (d / "text.txt").write_text("calibrate on this")
    >>> load_calibration(d / "text.txt", vocab_size=16, model_dir="fixtures/checkpoints/mixtral")
    Traceback (most recent call last):
    smoe.errors.RefusedInput: /.../text.txt: text needs the checkpoint's tokenizer, and ...
    """
    path = Path(path)
    _check_args(path, vocab_size, seq_len, max_tokens)
    kind = _kind(path)
    fd = fileio.open_input(path)  # anything but a regular file: NotRegular, never blocking
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise RefusedInput(f"{path}: empty file, no token ids")
        if size > MAX_BYTES:
            raise RefusedInput(
                f"{path}: {size} bytes, more than the {MAX_BYTES >> 30} GiB a calibration "
                "DATA file may have"
            )
        if kind == "npy":
            raw = _read_npy(path, fd, size)
        elif kind == "safetensors":
            raw = _read_safetensors(path, fd, size)
        else:
            raw = _read_text(path, fd, size, Path(model_dir))
        _check_range(path, raw, vocab_size)
        rows = _sequences(path, raw, seq_len)
        keep = rows.shape[0] if max_tokens is None else max(1, max_tokens // rows.shape[1])
        ids = np.array(rows[:keep], dtype=np.int64, order="C", copy=True)
        del raw, rows  # a .npy's map closes with its last view
        digest = _sha256(path, fd, size)
    finally:
        os.close(fd)
    return CalibrationData(path, kind, digest, size, ids)


# ---- arguments and kinds -----------------------------------------------------------------
def _check_args(path: Path, vocab_size: int, seq_len: int, max_tokens: int | None) -> None:
    """An API caller's bad number is a usage error, refused before the file is opened."""
    checks: tuple[tuple[str, Any, int], ...] = (
        ("vocab_size", vocab_size, 1),
        ("seq_len", seq_len, 2),
        ("max_tokens", max_tokens, 1),
    )
    for name, value, least in checks:
        if value is None and name == "max_tokens":
            continue
        number = None
        if not isinstance(value, bool):
            with contextlib.suppress(TypeError):
                number = operator.index(value)
        if number is None or number < least:
            raise UsageError(f"{path}: {name} must be an integer >= {least}, got {value!r}")


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".npy": "npy", ".safetensors": "safetensors"}.get(suffix, "text")


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _check_array(path: Path, dtype: str, ok: bool, shape: tuple[int, ...]) -> None:
    """The checks every kind of ids passes: integers, 1-D or 2-D, not empty."""
    if not ok:
        raise RefusedInput(f"{path}: token ids must be integers, got {dtype}")
    if len(shape) not in (1, 2):
        raise RefusedInput(
            f"{path}: token ids must be 1-D or 2-D, got {len(shape)} dimensions (shape "
            f"{list(shape)})"
        )
    if math.prod(shape) == 0:
        raise RefusedInput(f"{path}: no token ids (shape {list(shape)})")


# ---- .npy --------------------------------------------------------------------------------
def _read_npy(path: Path, fd: int, size: int) -> np.ndarray:
    """The array, mapped read-only, after its header has been checked against the file."""
    head = fileio.pread_exact(fd, min(size, _NPY_HEAD), 0, path)
    if not head.startswith(_NPY_MAGIC):
        raise RefusedInput(f"{path}: not a .npy file (it does not begin with \\x93NUMPY)")
    buf = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(buf)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(buf)
        else:  # 2.0 and 3.0 share the layout (3.0 spells field names in UTF-8)
            shape, _, dtype = np.lib.format.read_array_header_2_0(buf)
    except Exception as e:  # ValueError, but numpy's header parser also raises SyntaxError,
        # tokenize.TokenError, ... on a hostile header
        raise RefusedInput(f"{path}: not a readable .npy file: {_one_line(e)}") from None
    dtype = np.dtype(dtype)
    plain = dtype.kind in "iu" and dtype.fields is None and dtype.subdtype is None
    _check_array(path, dtype.name, plain, shape)
    start = buf.tell()
    need = math.prod(shape) * dtype.itemsize
    if start + need != size:
        what = "truncated" if start + need > size else "has bytes after its data"
        raise RefusedInput(
            f"{path}: .npy file {what}: shape {list(shape)} of {dtype.name} needs {need} bytes "
            f"after the {start}-byte header, the file holds {size - start}"
        )
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r")
    except OSError as e:
        raise UnreadableInput.from_os(e) from None
    except Exception as e:  # the header, already parsed once, should not fail here
        raise RefusedInput(f"{path}: not a readable .npy file: {_one_line(e)}") from None
    try:
        same = fileio.same_file(os.stat(path), os.fstat(fd))
    except OSError:
        same = False
    if not (isinstance(arr, np.ndarray) and same and arr.shape == shape and arr.dtype == dtype):
        raise SmoeError(f"{path}: the file changed while it was read")
    return arr


# ---- .safetensors ------------------------------------------------------------------------
def _read_safetensors(path: Path, fd: int, size: int) -> np.ndarray:
    """The ``input_ids`` tensor, read whole (its bytes lie inside the file: read_header)."""
    tensors = read_header(path)
    info = tensors.get("input_ids")
    if info is None:
        names = [repr(n) for n in tensors]
        more = len(names) - _NAMES_SHOWN
        has = ", ".join(names[:_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")
        raise RefusedInput(
            f"{path}: no tensor 'input_ids' (it has {has or 'no tensors'}); token ids go in "
            "input_ids"
        )
    code = _INT_DTYPES.get(info.dtype)
    _check_array(path, info.dtype, code is not None, info.shape)
    assert code is not None
    if info.offset + info.nbytes > size:
        raise SmoeError(f"{path}: the file changed while it was read")
    buf = np.empty(info.nbytes, np.uint8)
    fileio.preadv_exact(fd, buf, info.offset, path)
    return buf.view(np.dtype(code)).reshape(info.shape)


# ---- text --------------------------------------------------------------------------------
def _read_text(path: Path, fd: int, size: int, model_dir: Path) -> np.ndarray:
    """The text's ids under the checkpoint's tokenizer, whole, no special tokens added."""
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise RefusedInput(
            f"{path}: text needs the checkpoint's tokenizer, and {model_dir} has no tokenizer "
            "files; give token ids instead (.npy, or .safetensors with input_ids)"
        )
    data = fileio.pread_exact(fd, size, 0, path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RefusedInput(
            f"{path}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
            f"({e.reason}); token ids go in .npy or .safetensors"
        ) from None
    nul = data.find(b"\0")  # never inside a UTF-8 sequence: binary ids, not text
    if nul >= 0:
        raise RefusedInput(
            f"{path}: not text: a NUL byte at offset {nul}; token ids go in .npy or .safetensors"
        )
    del data
    tokenizer, log = _tokenizer(path, model_dir)
    level = log.get_verbosity()
    log.set_verbosity_error()  # not the "longer than model_max_length" warning: we window
    try:
        ids = tokenizer.encode(text.removeprefix("\ufeff"), add_special_tokens=False)
    except Exception as e:
        raise RefusedInput(
            f"{path}: the tokenizer of {model_dir} failed on the text: {_one_line(e)}"
        ) from None
    finally:
        log.set_verbosity(level)
    out = np.asarray(ids, dtype=np.int64)
    if out.size == 0:
        raise RefusedInput(f"{path}: no tokens: the text tokenises to nothing")
    return out.reshape(-1)


def _tokenizer(path: Path, model_dir: Path) -> tuple[Any, Any]:
    """``AutoTokenizer.from_pretrained(model_dir)`` and transformers' logging module."""
    try:  # imported here: transformers (and torch) only for text DATA
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise MissingExtra.needs(
            f"{path}: text DATA is tokenised with transformers, which is not installed",
            "calibrate",
        ) from None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(model_dir), local_files_only=True, trust_remote_code=False
        )
    except Exception as e:  # any failure of a third-party loader: one line, ours
        raise RefusedInput(
            f"{path}: the tokenizer of {model_dir} cannot be loaded: {_one_line(e)}"
        ) from None
    return tokenizer, transformers.utils.logging


# ---- ids ---------------------------------------------------------------------------------
def _check_range(path: Path, ids: np.ndarray, vocab_size: int) -> None:
    """Every id in ``0..vocab_size-1``, scanned in chunks (bounded memory); else the first
    one outside, by position."""
    limits = np.iinfo(ids.dtype)
    if limits.min >= 0 and limits.max < vocab_size:
        return  # the dtype cannot hold an id outside
    step = _SCAN_CHUNK if ids.ndim == 1 else max(1, _SCAN_CHUNK // ids.shape[1])
    for start in range(0, ids.shape[0], step):
        block = np.asarray(ids[start : start + step])
        bad = (block < 0) | (block >= vocab_size)
        if bad.any():
            at = np.unravel_index(int(np.argmax(bad)), bad.shape)
            value = int(block[at])
            where = (
                f"index {start + int(at[0])}"
                if ids.ndim == 1
                else f"[{start + int(at[0])}, {int(at[1])}]"
            )
            raise RefusedInput(
                f"{path}: token id {value} at {where} is out of range: ids must be in "
                f"0..{vocab_size - 1} (vocab_size {vocab_size})"
            )


def _sequences(path: Path, ids: np.ndarray, seq_len: int) -> np.ndarray:
    """2-D ids as they are; 1-D ids in windows of ``seq_len`` (a view, nothing copied)."""
    if ids.ndim == 2:
        if ids.shape[1] < 2:
            raise RefusedInput(
                f"{path}: sequences of {ids.shape[1]} token (shape {list(ids.shape)}); a "
                "sequence needs at least 2 tokens"
            )
        return ids
    n = ids.shape[0]
    if n < 2:
        raise RefusedInput(f"{path}: {n} token; a sequence needs at least 2 tokens")
    if n < seq_len:
        return ids.reshape(1, n)
    windows = n // seq_len
    return ids[: windows * seq_len].reshape(windows, seq_len)


def _sha256(path: Path, fd: int, size: int) -> str:
    """The file's sha256, read in chunks of :data:`_HASH_CHUNK` bytes."""
    digest = hashlib.sha256()
    buf = memoryview(bytearray(min(size, _HASH_CHUNK)))
    for at in range(0, size, len(buf)):
        piece = buf[: min(len(buf), size - at)]
        fileio.preadv_exact(fd, piece, at, path)
        digest.update(piece)
    return digest.hexdigest()
