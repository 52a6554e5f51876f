"""llama.cpp importance matrices (``llama-imatrix`` output) mapped onto our expert tensors.

An importance matrix holds, per weight tensor of a model, the mean square of each input
channel over a calibration text, ``E[x_j^2]`` -- one value per *column* of our
``[rows, cols]`` matrices. Two forms exist, both read here with positioned reads
(:class:`smoe.format.view.FileView`, never a memory map), every count bounded by the file size
before anything is allocated:

* **GGUF** (llama.cpp's default since PR 9400): ``general.type = "imatrix"``; keys
  ``imatrix.datasets`` (strings), ``imatrix.chunk_count`` and ``imatrix.chunk_size``
  (u32); per weight ``W`` the F32 tensors ``W.in_sum2`` (ne ``[cols, n_mat]``: sums of
  ``x^2``), ``W.counts`` (ne ``[1, n_mat]``: tokens seen per matrix) and optionally
  ``W.in_sum`` (sums of ``x``, unused here). Routed experts are the 3-D weights
  ``blk.L.ffn_{gate,up,down}_exps.weight`` (or ``ffn_gate_up_exps``), one row per expert;
  importance = ``in_sum2[E] / counts[E]``. A file converted from the legacy form has one
  count for all experts (``in_sum2`` ne ``[n_expert * cols, 1]``).
* **legacy ``.dat``**: int32 entry count; per entry int32 name length, the name, int32
  ``ncall``, int32 ``nval`` and ``nval`` float32 values, each ``mean(x^2) * ncall`` (the
  experts of a 3-D weight one after the other); then, optionally, int32 chunk count and
  int32 length + dataset name. Importance = value / ``ncall``. Files from before the
  merged 3-D experts (early 2024) name experts ``blk.L.ffn_gate.E.weight``.

The layout follows llama.cpp's ``tools/imatrix/imatrix.cpp`` (``save_imatrix``,
``save_imatrix_legacy``), ``common/imatrix-loader.cpp`` and the GGUF reader
``ggml/src/gguf.cpp`` (whose checks this reader applies, bar its 64-byte name limit, and
more); key names, value and ggml types come from the ``gguf`` package (``pip install
'smoe[imatrix]'``). Its own ``GGUFReader`` is not used: it maps the file (a file that
shrinks would kill the process with SIGBUS) and does not bound counts by the file size.

An expert without data (count 0, the all-ones placeholder llama.cpp writes for such an
expert in a multi-expert entry, an all-zero row, or no entry at all) falls back to
unweighted quantisation; :meth:`ImportanceMatrix.check` lists them before any work.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smoe.errors import SmoeError
from smoe.format.manifest import checksum
from smoe.format.view import FileView, chunks
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["Fallback", "ImatrixInfo", "ImportanceMatrix"]

MAX_ARRAY = 1 << 30  # ggml's GGUF_MAX_ARRAY_ELEMENTS
MAX_STRING = 1 << 30  # ggml's GGUF_MAX_STRING_LENGTH
MAX_DIMS = 4  # GGML_MAX_DIMS
HEADER_WINDOW = 1 << 20  # header bytes read at a time
# the expert naming of llama.cpp before the merged 3-D expert tensors (PR 6387, April 2024)
OLD_EXPERT = {
    "gate_proj": "blk.{L}.ffn_gate.{E}.weight",
    "up_proj": "blk.{L}.ffn_up.{E}.weight",
    "down_proj": "blk.{L}.ffn_down.{E}.weight",
}
NO_ENTRY, NO_COUNT, ALL_ZERO = "not in the file", "count 0", "all zero"


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise SmoeError(
            "reading llama.cpp importance matrices needs the gguf package: "
            "pip install 'smoe[imatrix]'"
        ) from None
    return gguf


@dataclass(frozen=True)
class ImatrixInfo:
    """What the summary and the manifest record about the file.

    >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
    >>> info = ImportanceMatrix.open(dat).info
    >>> info.format, info.size, info.entries, info.chunk_count, info.sha256[:12]
    ('dat', 554, 1, None, 'c053cf568240')
    """

    path: str
    format: str  # "gguf" or "dat"
    size: int
    crc32c: int
    sha256: str
    datasets: tuple[str, ...]
    chunk_count: int | None  # None: not in the file (old legacy files)
    chunk_size: int | None  # None: the legacy form does not store it
    entries: int  # weights the file has data for

    def as_json(self) -> dict[str, Any]:
        """The fields as a JSON object (the manifest's ``imatrix`` record).

        >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
        >>> doc = ImportanceMatrix.open(dat).info.as_json()
        >>> {k: doc[k] for k in ("format", "crc32c", "datasets", "chunk_size")}
        {'format': 'dat', 'crc32c': 3813154962, 'datasets': [], 'chunk_size': None}
        """
        return {
            "path": self.path,
            "format": self.format,
            "size": self.size,
            "crc32c": self.crc32c,
            "sha256": self.sha256,
            "datasets": list(self.datasets),
            "chunk_count": self.chunk_count,
            "chunk_size": self.chunk_size,
            "entries": self.entries,
        }


@dataclass(frozen=True)
class Fallback:
    """An expert tensor quantised without importance, and why.

    >>> Fallback(layer=0, expert=3, tensor="up_proj", reason=NO_COUNT)
    Fallback(layer=0, expert=3, tensor='up_proj', reason='count 0')
    """

    layer: int
    expert: int
    tensor: str
    reason: str  # NO_ENTRY, NO_COUNT or ALL_ZERO


@dataclass(frozen=True)
class _Entry:
    """One weight's values in the file: ``size`` float32 at ``offset``, then counts."""

    name: str  # the weight, e.g. blk.3.ffn_up_exps.weight
    what: str  # how messages name its values
    offset: int
    size: int
    counts: np.ndarray  # float64: one per matrix, or one for all (legacy: [ncall])
    legacy: bool
    file_cols: int | None = None  # GGUF in_sum2 of several matrices: its row length

    def divisor(self, index: int) -> float:
        if self.legacy:  # llama.cpp's loader: values / ncall, or the values when ncall is 0
            return float(self.counts[0]) or 1.0
        return float(self.counts[index if len(self.counts) > 1 else 0])


class ImportanceMatrix:
    """An opened, fully validated importance matrix.

    ``open`` reads and checks the header, the counts and every sum (finite, >= 0) and
    hashes the file (CRC-32C and SHA-256, in :attr:`info`); :meth:`check` maps a
    checkpoint's experts onto the file (refusing a wrong model) and lists the fallbacks;
    :meth:`for_expert` returns one tensor's per-column importance with one ``pread``.

    >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
    >>> with ImportanceMatrix.open(dat) as imatrix:
    ...     print(imatrix)
    ...     fallbacks = imatrix.check([(0, e, [(32, 64), (32, 64), (64, 32)]) for e in range(4)])
    ...     print(imatrix.fallback_warning(fallbacks, 12))
    ...     imatrix.for_expert(0, 1, "down_proj", cols=32)[:3]  # expert 1's sums / ncall
    ImportanceMatrix('fixtures/imatrix_tiny.dat', dat, 1 entries)
    fixtures/imatrix_tiny.dat: 8 of 12 expert tensors have no importance data (8 not in the file); \
they are quantised unweighted
    array([3.3, 3.4, 3.5], dtype=float32)
    """

    def __init__(self, view: FileView, info: ImatrixInfo, entries: dict[str, _Entry]) -> None:
        self.view = view
        self.info = info
        self.entries = entries
        st = os.fstat(view.fd)
        self._stamp = (st.st_size, st.st_mtime_ns)
        self.fallbacks: list[Fallback] = []  # those for_expert returned None for

    @property
    def path(self) -> Path:
        """The file's path, as opened.

        >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
        >>> ImportanceMatrix.open(dat).path.name
        'imatrix_tiny.dat'
        """
        return self.view.path

    # ---- opening ---------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ImportanceMatrix:
        """Open and validate ``path`` (GGUF or legacy ``.dat``); refusals are one line.

        >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
        >>> ImportanceMatrix.open(dat)
        ImportanceMatrix('fixtures/imatrix_tiny.dat', dat, 1 entries)
        >>> ImportanceMatrix.open("fixtures/q4_v2.smoe")
        Traceback (most recent call last):
        smoe.errors.SmoeError: fixtures/q4_v2.smoe: not a llama.cpp importance matrix: no GGUF \
magic, and as a legacy .dat file its entry count 1162825043 at offset 0 cannot fit in 147456 bytes
        """
        gguf = _gguf()
        view = FileView.open(path)
        try:
            if view.size < 4:
                raise SmoeError(
                    f"{view.path}: {view.size} bytes, too short for an importance matrix"
                )
            chunk_count: int | None
            chunk_size: int | None
            if bytes(view.read(0, 4)) == b"GGUF":
                fmt = "gguf"
                entries, datasets, chunk_count, chunk_size = _GgufParser(view, gguf).parse()
            else:
                fmt = "dat"
                entries, datasets, chunk_count = _parse_legacy(view)
                chunk_size = None
            crc, sha = _scan(view, entries)
            info = ImatrixInfo(
                str(view.path),
                fmt,
                view.size,
                crc,
                sha,
                tuple(datasets),
                chunk_count,
                chunk_size,
                len(entries),
            )
            return cls(view, info, {e.name: e for e in entries})
        except BaseException:
            view.close()
            raise

    def close(self) -> None:
        """Close the file (also on leaving a ``with`` block).

        >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
        >>> imatrix = ImportanceMatrix.open(dat)
        >>> imatrix.close(); imatrix.view.closed
        True
        """
        self.view.close()

    def __enter__(self) -> ImportanceMatrix:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ImportanceMatrix({str(self.path)!r}, {self.info.format}, {self.info.entries} entries)"
        )

    # ---- mapping ---------------------------------------------------------------------
    def _locate(
        self,
        layer: int,
        expert: int,
        tensor: str,
        rows: int | None,
        cols: int,
        n_experts: int | None = None,
    ) -> tuple[_Entry, int] | None:
        """The entry holding (layer, expert, tensor) and the expert's index in it; None if
        the file has no entry for it. A shape that cannot be this tensor's is refused."""
        if tensor not in OLD_EXPERT:
            raise ValueError(f"unknown expert tensor {tensor!r}; expected one of {TENSOR_NAMES}")
        for name in _candidates(layer, tensor):
            entry = self.entries.get(name)
            if entry is not None:
                return entry, self._index(entry, layer, expert, tensor, rows, cols, n_experts)
        for name in _old_candidates(layer, expert, tensor):
            entry = self.entries.get(name)
            if entry is not None:
                self._shape_check(entry, layer, expert, tensor, rows, cols, single=True)
                return entry, 0
        return None

    def _ours(self, layer: int, expert: int, tensor: str, rows: int | None, cols: int) -> str:
        shape = f"[{rows}, {cols}]" if rows is not None else f"[.., {cols}]"
        return f"layer {layer} expert {expert} {tensor} is {shape} ({cols} input channels)"

    def _shape_check(
        self,
        entry: _Entry,
        layer: int,
        expert: int,
        tensor: str,
        rows: int | None,
        cols: int,
        single: bool = False,
    ) -> int:
        """How many experts ``entry`` covers for ``cols``-wide inputs; refuses a misfit."""
        ours = self._ours(layer, expert, tensor, rows, cols)
        if entry.file_cols is not None:
            if entry.file_cols != cols:
                n = entry.size // entry.file_cols
                raise SmoeError(
                    f"{self.path}: {entry.what} is [{n}, {entry.file_cols}] ({n} "
                    f"experts x {entry.file_cols} input channels), but {ours}: an "
                    "importance matrix of another model?"
                )
            return entry.size // cols
        if entry.size % cols or (single and entry.size != cols):
            raise SmoeError(
                f"{self.path}: {entry.what} holds {entry.size} values, not "
                f"{'one row' if single else 'whole rows'} of {cols}, but {ours}: "
                "an importance matrix of another model?"
            )
        return entry.size // cols

    def _index(
        self,
        entry: _Entry,
        layer: int,
        expert: int,
        tensor: str,
        rows: int | None,
        cols: int,
        n_experts: int | None,
    ) -> int:
        n = self._shape_check(entry, layer, expert, tensor, rows, cols)
        if n_experts is not None and n != n_experts:
            raise SmoeError(
                f"{self.path}: {entry.what} covers {n} experts of {cols} input "
                f"channels, but the checkpoint has {n_experts} experts per layer: "
                "an importance matrix of another model?"
            )
        if expert >= n:
            raise SmoeError(
                f"{self.path}: {entry.what} covers {n} experts, but the checkpoint "
                f"has layer {layer} expert {expert}: an importance matrix of "
                "another model?"
            )
        return expert

    def _row(self, entry: _Entry, index: int, cols: int) -> tuple[np.ndarray | None, str]:
        """The importance of one matrix of ``entry`` (float32), or None and the reason."""
        st = os.fstat(self.view.fd)
        if (st.st_size, st.st_mtime_ns) != self._stamp:
            raise SmoeError(
                f"{self.path}: changed while smoe was reading it (size or "
                "modification time differ from when it was opened)"
            )
        divisor = entry.divisor(index)
        if divisor == 0:
            return None, NO_COUNT
        at = entry.offset + 4 * index * cols
        values = self.view.read(at, 4 * cols).view("<f4")
        _check_values(self.path, entry, values, at)
        if not values.any():
            return None, ALL_ZERO
        importance = (values.astype(np.float64) / divisor).astype(np.float32)
        if entry.size > cols and bool((importance == 1.0).all()):
            return None, NO_COUNT  # llama.cpp's placeholder for an expert without data
        return importance, ""

    def check(
        self,
        experts: Iterable[tuple[int, int, Sequence[tuple[int, int]]]],
        n_experts: int | None = None,
    ) -> list[Fallback]:
        """Map every (layer, expert, (gate, up, down) shapes) onto the file, before any work.

        Refuses a shape or expert count that is not this model's and a file with no entry
        for any of them; returns the expert tensors that will be quantised unweighted. Pass
        ``n_experts`` (experts per layer): a legacy file stores a layer's experts as one
        run of values, which only the expert count tells from another model's.

        >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
        >>> imatrix = ImportanceMatrix.open(dat)
        >>> shapes = [(32, 64), (32, 64), (64, 32)]  # gate, up, down
        >>> imatrix.check([(0, e, shapes) for e in range(4)], n_experts=4)[:2]
        [Fallback(layer=0, expert=0, tensor='gate_proj', reason='not in the file'),
         Fallback(layer=0, expert=0, tensor='up_proj', reason='not in the file')]
        >>> imatrix.check([(0, e, shapes) for e in range(8)], n_experts=8)
        Traceback (most recent call last):
        smoe.errors.SmoeError: fixtures/imatrix_tiny.dat: legacy entry \
'blk.0.ffn_down_exps.weight' covers 4 experts of 32 input channels, but the checkpoint has 8 \
experts per layer: an importance matrix of another model?
        """
        out: list[Fallback] = []
        mapped = wanted = 0
        for layer, expert, shapes in experts:
            for tensor, (rows, cols) in zip(TENSOR_NAMES, shapes):
                wanted += 1
                found = self._locate(layer, expert, tensor, rows, cols, n_experts)
                if found is None:
                    out.append(Fallback(layer, expert, tensor, NO_ENTRY))
                    continue
                mapped += 1
                values, reason = self._row(found[0], found[1], cols)
                if values is None:
                    out.append(Fallback(layer, expert, tensor, reason))
        if wanted and not mapped:
            raise SmoeError(
                f"{self.path}: has no entry for any routed-expert tensor of this "
                "model (blk.L.ffn_gate_exps.weight, ffn_up_exps, ffn_down_exps): an "
                "importance matrix of another model, or of a dense one?"
            )
        return out

    def fallback_warning(self, fallbacks: Sequence[Fallback], total: int) -> str | None:
        """The one warning line about ``fallbacks`` out of ``total`` expert tensors, or None.

        >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
        >>> imatrix = ImportanceMatrix.open(dat)
        >>> print(imatrix.fallback_warning([Fallback(0, 1, "gate_proj", NO_ENTRY)], 12))
        fixtures/imatrix_tiny.dat: 1 of 12 expert tensors have no importance data (1 not in the \
file); they are quantised unweighted
        >>> imatrix.fallback_warning([], 12) is None
        True
        """
        if not fallbacks:
            return None
        reasons = Counter(f.reason for f in fallbacks)
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
        return (
            f"{self.path}: {len(fallbacks)} of {total} expert tensors have no importance "
            f"data ({why}); they are quantised unweighted"
        )

    def for_expert(
        self, layer: int, expert: int, tensor: str, cols: int, rows: int | None = None
    ) -> np.ndarray | None:
        """Per-column importance (float32 ``[cols]``) of one expert tensor, or None: no data.

        ``tensor`` is ``gate_proj``, ``up_proj`` or ``down_proj``; ``cols`` its input width
        (d_model for gate/up, the expert FFN width for down); ``rows`` only names the shape
        in messages. A None is recorded in :attr:`fallbacks`. Call :meth:`check` first: it
        also checks the expert count.

        >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
        >>> imatrix = ImportanceMatrix.open(dat)
        >>> imatrix.for_expert(0, 0, "down_proj", cols=32)[:4]  # the sums of x^2 / ncall
        array([0.1, 0.2, 0.3, 0.4], dtype=float32)
        >>> imatrix.for_expert(0, 0, "gate_proj", cols=64) is None, imatrix.fallbacks
        (True, [Fallback(layer=0, expert=0, tensor='gate_proj', reason='not in the file')])
        """
        found = self._locate(layer, expert, tensor, rows, cols)
        if found is None:
            self.fallbacks.append(Fallback(layer, expert, tensor, NO_ENTRY))
            return None
        values, reason = self._row(found[0], found[1], cols)
        if values is None:
            self.fallbacks.append(Fallback(layer, expert, tensor, reason))
        return values


def _candidates(layer: int, tensor: str) -> list[str]:
    """Merged 3-D expert weights that hold ``tensor``'s input statistics, best first.

    gate and up take the same input, so either one's entry (or the fused gate_up) serves.
    """
    gguf = _gguf()
    names = gguf.TENSOR_NAMES
    mt = gguf.MODEL_TENSOR
    order = {
        "gate_proj": (mt.FFN_GATE_EXP, mt.FFN_GATE_UP_EXP, mt.FFN_UP_EXP),
        "up_proj": (mt.FFN_UP_EXP, mt.FFN_GATE_UP_EXP, mt.FFN_GATE_EXP),
        "down_proj": (mt.FFN_DOWN_EXP,),
    }[tensor]
    return [names[t].format(bid=layer) + ".weight" for t in order if t in names]


def _old_candidates(layer: int, expert: int, tensor: str) -> list[str]:
    siblings = {
        "gate_proj": ("gate_proj", "up_proj"),
        "up_proj": ("up_proj", "gate_proj"),
        "down_proj": ("down_proj",),
    }[tensor]
    return [OLD_EXPERT[t].format(L=layer, E=expert) for t in siblings]


# ---- validation of the values ---------------------------------------------------------------
def _check_values(path: Path, entry: _Entry, values: np.ndarray, at: int) -> None:
    """Refuse the first non-finite or negative sum in ``values`` (read at offset ``at``)."""
    bad = ~np.isfinite(values) | (values < 0)
    if not bad.any():
        return
    i = int(np.argmax(bad))
    index = (at - entry.offset) // 4 + i
    where = f"value {index}"
    if entry.file_cols is not None:
        where = f"expert {index // entry.file_cols}, channel {index % entry.file_cols}"
    v = float(values[i])
    why = "negative" if np.isfinite(v) else "not finite"
    raise SmoeError(
        f"{path}: {entry.what} holds {v!r} at offset {at + 4 * i} ({where}): a sum "
        f"of squares is finite and >= 0, this one is {why}"
    )


def _scan(view: FileView, entries: list[_Entry]) -> tuple[int, str]:
    """CRC-32C and SHA-256 of the whole file in one pass, checking every sum on the way."""
    crc, sha = 0, hashlib.sha256()
    pos = 0
    for entry in sorted(entries, key=lambda e: e.offset):
        for _, piece in chunks(view, pos, entry.offset):
            crc = checksum(piece, crc)
            sha.update(piece)
        end = entry.offset + 4 * entry.size
        for at, piece in chunks(view, entry.offset, end):
            crc = checksum(piece, crc)
            sha.update(piece)
            _check_values(view.path, entry, piece.view("<f4"), at)
        pos = end
    for _, piece in chunks(view, pos, view.size):
        crc = checksum(piece, crc)
        sha.update(piece)
    return crc, sha.hexdigest()


# ---- the GGUF form ----------------------------------------------------------------------------
class _GgufParser:
    """Header, key-values and tensor infos of a GGUF file, read through a bounded window."""

    def __init__(self, view: FileView, gguf: Any) -> None:
        self.view, self.g, self.path, self.size = view, gguf, view.path, view.size
        self.pos = 0
        self._buf = np.empty(0, np.uint8)
        self._buf_at = 0
        vt = gguf.GGUFValueType
        self.scalars = {
            vt.UINT8: "<u1",
            vt.INT8: "<i1",
            vt.UINT16: "<u2",
            vt.INT16: "<i2",
            vt.UINT32: "<u4",
            vt.INT32: "<i4",
            vt.FLOAT32: "<f4",
            vt.BOOL: "<u1",
            vt.UINT64: "<u8",
            vt.INT64: "<i8",
            vt.FLOAT64: "<f8",
        }

    # -- bounded reads --
    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.pos:
            raise SmoeError(
                f"{self.path}: {what} at offset {self.pos} needs {n} bytes, but the "
                f"file ends at offset {self.size} (truncated?)"
            )
        lo = self.pos - self._buf_at
        if lo < 0 or lo + n > len(self._buf):
            self._buf_at = self.pos
            self._buf = self.view.read(self.pos, min(self.size - self.pos, max(n, HEADER_WINDOW)))
            lo = 0
        self.pos += n
        return self._buf[lo : lo + n].tobytes()

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str, strict: bool = True) -> str:
        at = self.pos
        n = self.u64(f"{what} length")
        if n > MAX_STRING:
            raise SmoeError(
                f"{self.path}: {what} at offset {at} is {n} bytes long (GGUF strings "
                f"are at most {MAX_STRING})"
            )
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if not strict:
                return raw.decode("utf-8", "replace")
            raise SmoeError(
                f"{self.path}: {what} at offset {at} is not valid UTF-8 (byte "
                f"0x{raw[e.start]:02x} at offset {at + 8 + e.start})"
            ) from None

    # -- the file --
    def parse(self) -> tuple[list[_Entry], list[str], int, int]:
        g = self.g
        self.take(4, "magic")
        version = self.u32("version")
        if version & 0xFFFF == 0 and version:
            raise SmoeError(
                f"{self.path}: GGUF version at offset 4 reads {version:#x}: a "
                "big-endian file; only little-endian GGUF is read"
            )
        if version not in (2, g.GGUF_VERSION):
            raise SmoeError(
                f"{self.path}: GGUF version {version} at offset 4; llama.cpp and "
                f"smoe read versions 2 and {g.GGUF_VERSION}"
            )
        n_tensors = self.u64("tensor count")
        n_kv = self.u64("key-value count")
        # the smallest key-value is 14 bytes (1-byte key, u8 value), tensor info 25 (0-d)
        if n_kv * 14 + n_tensors * 25 > self.size - self.pos:
            raise SmoeError(
                f"{self.path}: {n_tensors} tensors (count at offset 8) and {n_kv} "
                f"key-values (count at offset 16) cannot fit in {self.size} bytes"
            )
        kv = self.key_values(n_kv)
        alignment = self.alignment(kv)
        datasets = self.datasets(kv)
        chunk_count = self.u32_key(kv, g.Keys.IMatrix.CHUNK_COUNT)
        chunk_size = self.u32_key(kv, g.Keys.IMatrix.CHUNK_SIZE)
        if n_tensors == 0:
            raise SmoeError(
                f"{self.path}: holds no tensors (an importance matrix has an "
                "in_sum2 and a counts tensor per weight)"
            )
        infos = self.tensor_infos(n_tensors, alignment)
        return self.entries(infos), datasets, chunk_count, chunk_size

    def skip(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise SmoeError(
                f"{self.path}: {what} at offset {self.pos} needs {n} bytes, but the "
                f"file ends at offset {self.size} (truncated?)"
            )
        self.pos += n

    def skip_string(self, what: str) -> None:
        at = self.pos
        n = self.u64(f"{what} length")
        if n > MAX_STRING:
            raise SmoeError(
                f"{self.path}: {what} at offset {at} is {n} bytes long (GGUF strings "
                f"are at most {MAX_STRING})"
            )
        self.skip(n, what)

    def key_values(self, n: int) -> dict[str, tuple[int, Any, Any]]:
        """key -> (offset, type, value) of every key; values kept for the keys read here
        (a wrong general.type is refused as soon as it is read)."""
        g = self.g
        vt = g.GGUFValueType
        keep = {
            g.Keys.General.TYPE,
            g.Keys.General.ALIGNMENT,
            g.Keys.IMatrix.DATASETS,
            g.Keys.IMatrix.CHUNK_COUNT,
            g.Keys.IMatrix.CHUNK_SIZE,
        }
        out: dict[str, tuple[int, Any, Any]] = {}
        for i in range(n):
            at = self.pos
            key = self.string(f"key {i}")
            if not key:
                raise SmoeError(f"{self.path}: key {i} at offset {at} is empty")
            if key in out:
                raise SmoeError(
                    f"{self.path}: key {key!r} at offset {at} appears twice (first at "
                    f"offset {out[key][0]})"
                )
            vtype = self.value_type(key, at)
            value: Any = None
            if vtype == vt.ARRAY:
                item = self.value_type(key, at)
                if item == vt.ARRAY:
                    raise SmoeError(
                        f"{self.path}: key {key!r} at offset {at} is an array of "
                        "arrays, which GGUF readers refuse"
                    )
                count = self.u64(f"key {key!r} array length")
                least = 8 if item == vt.STRING else np.dtype(self.scalars[item]).itemsize
                if count > MAX_ARRAY or count * least > self.size - self.pos:
                    raise SmoeError(
                        f"{self.path}: key {key!r} at offset {at} claims an array of "
                        f"{count} {item.name} values; the file has "
                        f"{self.size - self.pos} bytes left"
                    )
                if item != vt.STRING:
                    self.skip(count * least, f"key {key!r} values")
                elif key in keep:  # dataset names: paths, shown as they decode
                    value = [
                        self.string(f"key {key!r} item {j}", strict=False) for j in range(count)
                    ]
                else:
                    for j in range(count):
                        self.skip_string(f"key {key!r} item {j}")
                vtype = (vt.ARRAY, item)
            elif vtype == vt.STRING:
                if key in keep:
                    value = self.string(f"key {key!r} value")
                else:
                    self.skip_string(f"key {key!r} value")
            else:
                dtype = np.dtype(self.scalars[vtype])
                value = np.frombuffer(self.take(dtype.itemsize, f"key {key!r} value"), dtype)[
                    0
                ].item()
            out[key] = (at, vtype, value)
            if key == g.Keys.General.TYPE:
                self.check_type(out)
        if g.Keys.General.TYPE not in out:
            self.check_type(out)
        return out

    def value_type(self, key: str, at: int) -> Any:
        raw = self.u32(f"key {key!r} type")
        try:
            return self.g.GGUFValueType(raw)
        except ValueError:
            raise SmoeError(
                f"{self.path}: key {key!r} at offset {at} has unknown value type {raw}"
            ) from None

    def _type_name(self, vtype: Any) -> str:
        if isinstance(vtype, tuple):
            return f"an array of {vtype[1].name}"
        return vtype.name

    def check_type(self, kv: dict[str, tuple[int, Any, Any]]) -> None:
        g = self.g
        key = g.Keys.General.TYPE
        if key not in kv:
            raise SmoeError(
                f"{self.path}: not a llama.cpp importance matrix: no {key} key "
                f"(llama-imatrix writes {key} = {g.GGUFType.IMATRIX})"
            )
        at, vtype, value = kv[key]
        if vtype != g.GGUFValueType.STRING:
            raise SmoeError(
                f"{self.path}: key {key} at offset {at} is "
                f"{self._type_name(vtype)}, expected a STRING"
            )
        if value != g.GGUFType.IMATRIX:
            raise SmoeError(
                f"{self.path}: not a llama.cpp importance matrix: {key} at offset "
                f"{at} is {value!r}, expected {g.GGUFType.IMATRIX!r} (a GGUF model "
                "is not an importance matrix; llama-imatrix makes one)"
            )

    def missing(self, key: str) -> None:
        k = self.g.Keys.IMatrix
        raise SmoeError(
            f"{self.path}: has no {key} key (llama-imatrix writes {k.DATASETS}, "
            f"{k.CHUNK_COUNT} and {k.CHUNK_SIZE}; llama-quantize refuses a file "
            "without them)"
        )

    def u32_key(self, kv: dict[str, tuple[int, Any, Any]], key: str) -> int:
        if key not in kv:
            self.missing(key)
        at, vtype, value = kv[key]
        if vtype != self.g.GGUFValueType.UINT32:
            raise SmoeError(
                f"{self.path}: key {key} at offset {at} is "
                f"{self._type_name(vtype)}, expected UINT32"
            )
        return int(value)

    def alignment(self, kv: dict[str, tuple[int, Any, Any]]) -> int:
        key = self.g.Keys.General.ALIGNMENT
        if key not in kv:
            return int(self.g.GGUF_DEFAULT_ALIGNMENT)
        at, vtype, value = kv[key]
        if vtype != self.g.GGUFValueType.UINT32:
            raise SmoeError(
                f"{self.path}: key {key} at offset {at} is "
                f"{self._type_name(vtype)}, expected UINT32"
            )
        if value == 0 or value & (value - 1):
            raise SmoeError(f"{self.path}: key {key} at offset {at} is {value}, not a power of two")
        return int(value)

    def datasets(self, kv: dict[str, tuple[int, Any, Any]]) -> list[str]:
        key = self.g.Keys.IMatrix.DATASETS
        if key not in kv:
            self.missing(key)
        at, vtype, value = kv[key]
        if vtype != (self.g.GGUFValueType.ARRAY, self.g.GGUFValueType.STRING):
            raise SmoeError(
                f"{self.path}: key {key} at offset {at} is "
                f"{self._type_name(vtype)}, expected an array of STRING"
            )
        return list(value)

    def tensor_infos(self, n: int, alignment: int) -> dict[str, tuple[int, Any, tuple, int]]:
        """name -> (info offset, ggml type, ne, absolute data offset), all checked."""
        g = self.g
        infos: dict[str, tuple[int, Any, tuple, int]] = {}
        expected = 0
        places = []
        for i in range(n):
            at = self.pos
            name = self.string(f"tensor {i} name")
            if not name:
                raise SmoeError(f"{self.path}: tensor {i} at offset {at} has an empty name")
            if name in infos:
                raise SmoeError(
                    f"{self.path}: tensor {name!r} at offset {at} appears twice "
                    f"(first at offset {infos[name][0]})"
                )
            n_dims = self.u32(f"tensor {name!r} dimension count")
            if n_dims > MAX_DIMS:
                raise SmoeError(
                    f"{self.path}: tensor {name!r} at offset {at} has {n_dims} "
                    f"dimensions (at most {MAX_DIMS})"
                )
            ne = tuple(self.u64(f"tensor {name!r} dimension {j}") for j in range(n_dims))
            elements = 1
            for d in ne:
                elements *= d
            if any(d >= 1 << 63 for d in ne) or elements >= 1 << 63:
                raise SmoeError(
                    f"{self.path}: tensor {name!r} at offset {at} has shape "
                    f"{list(ne)}: 2^63 elements or more"
                )
            raw = self.u32(f"tensor {name!r} type")
            try:
                ttype = g.GGMLQuantizationType(raw)
                block, type_size = g.GGML_QUANT_SIZES[ttype]
            except (ValueError, KeyError):
                raise SmoeError(
                    f"{self.path}: tensor {name!r} at offset {at} has unknown ggml type {raw}"
                ) from None
            if ne and ne[0] % block:
                raise SmoeError(
                    f"{self.path}: tensor {name!r} at offset {at} has rows of "
                    f"{ne[0]} elements, not a multiple of {ttype.name}'s block of "
                    f"{block}"
                )
            offset = self.u64(f"tensor {name!r} data offset")
            if offset != expected:
                raise SmoeError(
                    f"{self.path}: tensor {name!r} at offset {at} has data offset "
                    f"{offset}, expected {expected} (tensors follow each other, "
                    f"each padded to {alignment} bytes)"
                )
            nbytes = elements // block * type_size
            expected += -(-nbytes // alignment) * alignment
            infos[name] = (at, ttype, ne, offset)
            places.append(name)
        start = -(-self.pos // alignment) * alignment
        if start + expected > self.size:
            raise SmoeError(
                f"{self.path}: tensor data runs from offset {start} to "
                f"{start + expected}, beyond the end of the file ({self.size} bytes; "
                "truncated?)"
            )
        if start + expected < self.size:
            raise SmoeError(
                f"{self.path}: {self.size - start - expected} bytes at offset "
                f"{start + expected} after the last tensor "
                f"({places[-1]!r}) belong to no tensor"
            )
        return {k: (at, t, ne, start + off) for k, (at, t, ne, off) in infos.items()}

    def entries(self, infos: dict[str, tuple[int, Any, tuple, int]]) -> list[_Entry]:
        g = self.g
        f32 = g.GGMLQuantizationType.F32
        groups: dict[str, dict[str, str]] = {}
        for name in infos:
            for suffix in (".in_sum2", ".counts", ".in_sum"):
                if name.endswith(suffix) and len(name) > len(suffix):
                    groups.setdefault(name[: -len(suffix)], {})[suffix] = name
                    break
        out = []
        for base, parts in sorted(groups.items()):
            if ".in_sum2" not in parts or ".counts" not in parts:
                has, lacks = (
                    (".in_sum2", ".counts")
                    if ".in_sum2" in parts
                    else (
                        (".counts", ".in_sum2") if ".counts" in parts else (".in_sum", ".in_sum2")
                    )
                )
                raise SmoeError(
                    f"{self.path}: tensor {base + has!r} has no {base + lacks!r} "
                    "beside it (llama-imatrix writes in_sum2 and counts per weight)"
                )
            for name in parts.values():
                at, ttype, _, _ = infos[name]
                if ttype != f32:
                    raise SmoeError(
                        f"{self.path}: tensor {name!r} at offset {at} is {ttype.name}, expected F32"
                    )
            s_at, _, s_ne, s_off = infos[parts[".in_sum2"]]
            c_at, _, c_ne, c_off = infos[parts[".counts"]]
            size, n_counts = _prod(s_ne), _prod(c_ne)
            if not size or not n_counts:
                name, at = (parts[".in_sum2"], s_at) if not size else (parts[".counts"], c_at)
                raise SmoeError(f"{self.path}: tensor {name!r} at offset {at} holds no values")
            if len(s_ne) > 2 or size % n_counts or (len(s_ne) == 2 and s_ne[1] != n_counts):
                raise SmoeError(
                    f"{self.path}: tensor {parts['.in_sum2']!r} has ne {list(s_ne)} "
                    f"but {parts['.counts']!r} holds {n_counts} counts (in_sum2 is "
                    "[values per matrix, matrices], one count per matrix)"
                )
            if ".in_sum" in parts:
                i_at, _, i_ne, _ = infos[parts[".in_sum"]]
                if _prod(i_ne) != size:
                    raise SmoeError(
                        f"{self.path}: tensor {parts['.in_sum']!r} at offset {i_at} "
                        f"has ne {list(i_ne)}, in_sum2 {list(s_ne)}"
                    )
            counts = self.view.read(c_off, 4 * n_counts).view("<f4").astype(np.float64)
            bad = ~np.isfinite(counts) | (counts < 0) | (counts != np.round(counts))
            if bad.any():
                i = int(np.argmax(bad))
                raise SmoeError(
                    f"{self.path}: tensor {parts['.counts']!r} holds "
                    f"{float(counts[i])!r} at offset {c_off + 4 * i} (matrix {i}): "
                    "counts are whole numbers >= 0"
                )
            out.append(
                _Entry(
                    base,
                    f"tensor {parts['.in_sum2']!r}",
                    s_off,
                    size,
                    counts,
                    legacy=False,
                    file_cols=size // n_counts if n_counts > 1 else None,
                )
            )
        if not out:
            raise SmoeError(
                f"{self.path}: has no in_sum2/counts tensors: not a llama.cpp importance matrix"
            )
        return out


def _prod(ne: tuple[int, ...]) -> int:
    n = 1
    for d in ne:
        n *= d
    return n


# ---- the legacy form ------------------------------------------------------------------------
def _parse_legacy(view: FileView) -> tuple[list[_Entry], list[str], int | None]:
    """Entries, dataset names and chunk count of a legacy ``.dat`` file, every count bounded
    by the bytes left before it is used."""
    path, size = view.path, view.size

    def i32(at: int) -> int:
        return struct.unpack("<i", bytes(view.read(at, 4)))[0]

    n = i32(0)
    # each entry needs at least 17 bytes: name length, a 1-byte name, ncall, nval, a value
    if n < 1 or n * 17 > size - 4:
        raise SmoeError(
            f"{path}: not a llama.cpp importance matrix: no GGUF magic, and as a "
            f"legacy .dat file its entry count {n} at offset 0 "
            f"{'is not positive' if n < 1 else f'cannot fit in {size} bytes'}"
        )
    pos = 4
    entries: list[_Entry] = []
    seen: dict[str, int] = {}
    for i in range(n):
        at = pos
        if size - pos < 12:
            raise SmoeError(
                f"{path}: legacy entry {i} at offset {at} is cut off: the file ends "
                f"at offset {size} (truncated?)"
            )
        length = i32(pos)
        if length < 1 or length > size - pos - 12:
            raise SmoeError(
                f"{path}: legacy entry {i} at offset {at} has a name length of "
                f"{length}; {size - pos - 12} bytes are left for the name and values"
                + (" (not an importance matrix?)" if i == 0 else "")
            )
        raw = bytes(view.read(pos + 4, length))
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SmoeError(
                f"{path}: legacy entry {i} at offset {at} has a name that is not "
                f"valid UTF-8 (byte 0x{raw[e.start]:02x} at offset "
                f"{pos + 4 + e.start})"
            ) from None
        if "\0" in name:
            raise SmoeError(
                f"{path}: legacy entry {i} ({name!r}) at offset {at} has a NUL byte in its name"
            )
        if name in seen:
            raise SmoeError(
                f"{path}: legacy entry {i} at offset {at} names {name!r} again "
                f"(first at offset {seen[name]})"
            )
        pos += 4 + length
        if size - pos < 8:
            raise SmoeError(
                f"{path}: legacy entry {i} ({name!r}) at offset {at} is cut off "
                f"after its name: the file ends at offset {size}"
            )
        ncall, nval = i32(pos), i32(pos + 4)
        if ncall < 0:
            raise SmoeError(
                f"{path}: legacy entry {i} ({name!r}) has ncall {ncall} at offset "
                f"{pos}; it counts chunks, >= 0"
            )
        if nval < 1 or 4 * nval > size - pos - 8:
            raise SmoeError(
                f"{path}: legacy entry {i} ({name!r}) has nval {nval} at offset "
                f"{pos + 4}; {size - pos - 8} bytes are left for its values"
            )
        pos += 8
        seen[name] = at
        entries.append(
            _Entry(
                name,
                f"legacy entry {name!r}",
                pos,
                nval,
                np.array([ncall], np.float64),
                legacy=True,
            )
        )
        pos += 4 * nval
    chunk_count: int | None = None
    datasets: list[str] = []
    if pos < size:
        if size - pos < 4:
            raise SmoeError(
                f"{path}: {size - pos} bytes at offset {pos} after the last entry "
                "are too few for the chunk count (4 bytes; truncated?)"
            )
        chunk_count = i32(pos)
        if chunk_count < 0:
            raise SmoeError(f"{path}: chunk count {chunk_count} at offset {pos} is negative")
        pos += 4
    if pos < size:
        if size - pos < 4:
            raise SmoeError(
                f"{path}: {size - pos} bytes at offset {pos} after the chunk count "
                "are too few for the dataset name's length (truncated?)"
            )
        length = i32(pos)
        if length < 0 or length > size - pos - 4:
            raise SmoeError(
                f"{path}: dataset name length {length} at offset {pos}; "
                f"{size - pos - 4} bytes are left"
            )
        raw = bytes(view.read(pos + 4, length)).split(b"\0", 1)[0]
        if raw:
            datasets.append(raw.decode("utf-8", "replace"))
        pos += 4 + length
    if pos < size:
        raise SmoeError(
            f"{path}: {size - pos} bytes at offset {pos} after the dataset name belong to nothing"
        )
    return entries, datasets, chunk_count
