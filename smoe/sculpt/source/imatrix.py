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
``save_imatrix_legacy``) and ``common/imatrix-loader.cpp``; a GGUF file's header,
key-values and tensor infos are read by :mod:`smoe.interop.gguf_io` (the checks of
``ggml/src/gguf.cpp``, and more); key names, value and ggml types come from the ``gguf``
package (``pip install 'smoe[imatrix]'``; a legacy ``.dat`` file is read without it).

An expert without data (count 0, the all-ones placeholder llama.cpp writes for such an
expert in a multi-expert entry, an all-zero row, or no entry at all) falls back to
unweighted quantisation; :meth:`ImportanceMatrix.check` lists them before any work.

**Values and their range (the ruling).** Every sum must be finite and >= 0: a NaN, an
infinity or a negative value is refused when the file is opened, naming its offset (counts:
whole numbers >= 0). The importance of one expert tensor (one row of ``cols`` values) is
*bounded*, not refused: an entry below ``1 / RANGE_BOUND`` (``1e-10``) of the row's largest,
a zero included, is raised to that floor, and the sculpt's one importance-matrix warning
says how many expert tensors were raised, naming the one of the widest range with its
largest and smallest entries (:meth:`ImportanceMatrix.warning`). Real matrices hold mean
squares of activations; within one tensor they span a few decades (outlier channels
``1e4``--``1e6`` times the median, ``1e8`` at the outside), so the bound leaves two decades
of headroom and touches only broken or hostile files (issue 23, case 8: one channel
``3e38``, the rest ``1e-30``, a range of ``3e68``). Raising rather than refusing: a channel
under the floor weighs less than ``1e-10`` of the largest, below what the encoder's float32
sums resolve beside it, so raising it keeps what the weighting optimises, while a published
file is not lost for one rarely routed expert. Unbounded, such a channel becomes exactly 0
once the encoder divides by the largest, it counts for nothing, and a tensor whose one
important channel happens to be encoded exactly gets a weighted error of 0: no finite
``weighted_snr_db`` for a weighted tensor. With the floor, every entry of a weighted tensor
is positive, so its weighted error is 0 only when the encode is exact (and then ``snr_db``
is null too). A row whose floor would fall below float32's normal range (largest entry under
about ``1e-28``) is also scaled by a power of two, which is exact and changes nothing: the
encoder uses importance only relative to its largest entry.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from smoe.errors import MissingExtra, RefusedInput
from smoe.format.manifest import checksum
from smoe.format.view import FileView, chunks
from smoe.interop.gguf_io import GgufReader, KeyValue, Tensor
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["RANGE_BOUND", "Fallback", "ImatrixInfo", "ImportanceMatrix", "Raised"]

MERGED_EXPERTS = {
    "gate_proj": ("blk.{L}.ffn_gate_exps", "blk.{L}.ffn_gate_up_exps", "blk.{L}.ffn_up_exps"),
    "up_proj": ("blk.{L}.ffn_up_exps", "blk.{L}.ffn_gate_up_exps", "blk.{L}.ffn_gate_exps"),
    "down_proj": ("blk.{L}.ffn_down_exps",),
}
"""Per expert tensor, the merged 3-D weights (llama.cpp's names, gguf's ``FFN_GATE_EXP``,
``FFN_GATE_UP_EXP``, ``FFN_UP_EXP``, ``FFN_DOWN_EXP``) whose entry holds its input
statistics, best first: gate and up take the same input, so either's entry (or the fused
gate_up's) serves. Ours, so that a legacy ``.dat`` file is read without the gguf package
(a test checks them against gguf's)."""
# the expert naming of llama.cpp before the merged 3-D expert tensors (PR 6387, April 2024)
OLD_EXPERT = {
    "gate_proj": "blk.{L}.ffn_gate.{E}.weight",
    "up_proj": "blk.{L}.ffn_up.{E}.weight",
    "down_proj": "blk.{L}.ffn_down.{E}.weight",
}
NO_ENTRY, NO_COUNT, ALL_ZERO = "not in the file", "count 0", "all zero"
# the widest range one expert tensor's importance may span (largest entry / smallest entry):
# entries below 1 / RANGE_BOUND of the largest, zeros too, are raised to it (module docstring)
RANGE_DECADES = 10
RANGE_BOUND = 10.0**RANGE_DECADES
_F32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32


def _gguf(path: object) -> Any:
    try:
        import gguf
    except ImportError:
        raise MissingExtra.needs(
            f"{path}: a GGUF importance matrix is read with the gguf package", "imatrix"
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
class Raised:
    """An expert tensor whose importance spans more than :data:`RANGE_BOUND`: its entries
    below ``largest / RANGE_BOUND`` were raised to that (``smallest``: before, maybe 0).

    >>> Raised(layer=1, expert=2, tensor="down_proj", largest=3e38, smallest=1e-30)
    Raised(layer=1, expert=2, tensor='down_proj', largest=3e+38, smallest=1e-30)
    """

    layer: int
    expert: int
    tensor: str
    largest: float
    smallest: float

    @property
    def span(self) -> float:
        """largest / smallest (``inf`` for a zero entry).

        >>> Raised(0, 0, "gate_proj", 1e12, 0.5).span, Raised(0, 0, "gate_proj", 1e12, 0).span
        (2000000000000.0, inf)
        """
        return self.largest / self.smallest if self.smallest > 0 else math.inf


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
        self.raised: list[Raised] = []  # those check found beyond RANGE_BOUND

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
        smoe.errors.RefusedInput: fixtures/q4_v2.smoe: not a llama.cpp importance matrix: no GGUF \
magic, and as a legacy .dat file its entry count 1162825043 at offset 0 cannot fit in 147456 bytes
        """
        view = FileView.open(path)
        try:
            if view.size < 4:
                raise RefusedInput(
                    f"{view.path}: {view.size} bytes, too short for an importance matrix"
                )
            chunk_count: int | None
            chunk_size: int | None
            if bytes(view.read(0, 4)) == b"GGUF":
                fmt = "gguf"
                parser = _GgufImatrix(view, _gguf(view.path))  # (a legacy .dat file needs no gguf)
                entries, datasets, chunk_count, chunk_size = parser.parse()
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
                raise RefusedInput(
                    f"{self.path}: {entry.what} is [{n}, {entry.file_cols}] ({n} "
                    f"experts x {entry.file_cols} input channels), but {ours}: an "
                    "importance matrix of another model?"
                )
            return entry.size // cols
        if entry.size % cols or (single and entry.size != cols):
            raise RefusedInput(
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
            raise RefusedInput(
                f"{self.path}: {entry.what} covers {n} experts of {cols} input "
                f"channels, but the checkpoint has {n_experts} experts per layer: "
                "an importance matrix of another model?"
            )
        if expert >= n:
            raise RefusedInput(
                f"{self.path}: {entry.what} covers {n} experts, but the checkpoint "
                f"has layer {layer} expert {expert}: an importance matrix of "
                "another model?"
            )
        return expert

    def _row(
        self, entry: _Entry, index: int, cols: int
    ) -> tuple[np.ndarray | None, str, tuple[float, float] | None]:
        """The importance of one matrix of ``entry`` (float32, bounded by
        :func:`_bounded`), or None and the reason; and (largest, smallest) when raised."""
        st = os.fstat(self.view.fd)
        if (st.st_size, st.st_mtime_ns) != self._stamp:
            raise RefusedInput(
                f"{self.path}: changed while smoe was reading it (size or "
                "modification time differ from when it was opened)"
            )
        divisor = entry.divisor(index)
        if divisor == 0:
            return None, NO_COUNT, None
        at = entry.offset + 4 * index * cols
        values = self.view.read(at, 4 * cols).view("<f4")
        _check_values(self.path, entry, values, at)
        if not values.any():
            return None, ALL_ZERO, None
        importance = values.astype(np.float64) / divisor
        if entry.size > cols and bool((importance.astype(np.float32) == 1.0).all()):
            return None, NO_COUNT, None  # llama.cpp's placeholder for an expert without data
        bounded, raised = _bounded(importance)
        return bounded, "", raised

    def check(
        self,
        experts: Iterable[tuple[int, int, Sequence[tuple[int, int]]]],
        n_experts: int | None = None,
    ) -> list[Fallback]:
        """Map every (layer, expert, (gate, up, down) shapes) onto the file, before any work.

        Refuses a shape or expert count that is not this model's and a file with no entry
        for any of them; returns the expert tensors that will be quantised unweighted, and
        keeps those whose importance was raised to the range bound in :attr:`raised`. Pass
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
        smoe.errors.RefusedInput: fixtures/imatrix_tiny.dat: legacy entry \
'blk.0.ffn_down_exps.weight' covers 4 experts of 32 input channels, but the checkpoint has 8 \
experts per layer: an importance matrix of another model?
        """
        out: list[Fallback] = []
        raised: list[Raised] = []
        mapped = wanted = 0
        for layer, expert, shapes in experts:
            for tensor, (rows, cols) in zip(TENSOR_NAMES, shapes):
                wanted += 1
                found = self._locate(layer, expert, tensor, rows, cols, n_experts)
                if found is None:
                    out.append(Fallback(layer, expert, tensor, NO_ENTRY))
                    continue
                mapped += 1
                values, reason, span = self._row(found[0], found[1], cols)
                if values is None:
                    out.append(Fallback(layer, expert, tensor, reason))
                elif span is not None:
                    raised.append(Raised(layer, expert, tensor, *span))
        self.raised = raised
        if wanted and not mapped:
            raise RefusedInput(
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
        return f"{self.path}: {_fallback_words(fallbacks, total)}"

    def warning(self, fallbacks: Sequence[Fallback], total: int) -> str | None:
        """The one warning line of a sculpt with this matrix, or None: the expert tensors of
        ``fallbacks`` (out of ``total``), then those :meth:`check` raised to the range bound.

        >>> dat = "fixtures/imatrix_tiny.dat"  # 1 entry (layer 0 down_proj), 4 experts x 32
        >>> imatrix = ImportanceMatrix.open(dat)
        >>> imatrix.raised = [Raised(0, 1, "down_proj", 3e38, 1e-30),
        ...                   Raised(0, 2, "down_proj", 9, 0)]  # what check found
        >>> print(imatrix.warning([Fallback(0, 1, "gate_proj", NO_ENTRY)], 12))
        fixtures/imatrix_tiny.dat: 1 of 12 expert tensors have no importance data (1 not in the \
file); they are quantised unweighted; 2 of 12 expert tensors have importance spanning more \
than 1e10 (largest / smallest entry; widest: layer 0 expert 2 down_proj, 9 / 0); their entries \
below 1e-10 of their largest are raised to that
        >>> imatrix.raised = []; imatrix.warning([], 12) is None
        True
        """
        parts = [_fallback_words(fallbacks, total)] if fallbacks else []
        if self.raised:
            widest = max(self.raised, key=lambda r: r.span)
            parts.append(
                f"{len(self.raised)} of {total} expert tensors have importance spanning more "
                f"than 1e{RANGE_DECADES} (largest / smallest entry; widest: layer "
                f"{widest.layer} expert {widest.expert} {widest.tensor}, "
                f"{widest.largest:.3g} / {widest.smallest:.3g}); their entries below "
                f"1e-{RANGE_DECADES} of their largest are raised to that"
            )
        return f"{self.path}: {'; '.join(parts)}" if parts else None

    def for_expert(
        self, layer: int, expert: int, tensor: str, cols: int, rows: int | None = None
    ) -> np.ndarray | None:
        """Per-column importance (float32 ``[cols]``) of one expert tensor, or None: no data.

        ``tensor`` is ``gate_proj``, ``up_proj`` or ``down_proj``; ``cols`` its input width
        (d_model for gate/up, the expert FFN width for down); ``rows`` only names the shape
        in messages. A None is recorded in :attr:`fallbacks`. Call :meth:`check` first: it
        also checks the expert count. The values are the file's sums / counts, bounded to
        :data:`RANGE_BOUND` (see the module docstring).

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
        values, reason, _ = self._row(found[0], found[1], cols)
        if values is None:
            self.fallbacks.append(Fallback(layer, expert, tensor, reason))
        return values


def _fallback_words(fallbacks: Sequence[Fallback], total: int) -> str:
    reasons = Counter(f.reason for f in fallbacks)
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
    return (
        f"{len(fallbacks)} of {total} expert tensors have no importance data ({why}); "
        "they are quantised unweighted"
    )


def _bounded(importance: np.ndarray) -> tuple[np.ndarray, tuple[float, float] | None]:
    """One row of importance (float64, >= 0, not all 0) as float32 within
    :data:`RANGE_BOUND`: entries below ``largest / RANGE_BOUND`` raised to that, and
    (largest, smallest) when any was; a row whose floor is below float32's normal range
    scaled by a power of two first (exact; only ratios matter to the encoder).

    >>> h, raised = _bounded(np.array([1e12, 1.0, 0.0, 400.0]))  # floor 100
    >>> h.tolist(), raised
    ([999999995904.0, 100.0, 100.0, 400.0], (1000000000000.0, 0.0))
    >>> h, raised = _bounded(np.array([1e-36, 1e-40]))  # floor 1e-46: scaled by 2**119
    >>> round(float(h[0]), 6), round(float(h[1] / h[0]), 6), raised
    (0.664614, 0.0001, None)
    """
    top, low = float(importance.max()), float(importance.min())
    floor = top / RANGE_BOUND
    raised = None
    if low < floor:
        raised = (top, low)
        importance = np.maximum(importance, floor)
    if floor < _F32_TINY:
        importance = importance * math.ldexp(1.0, -math.frexp(top)[1])  # largest in [0.5, 1)
    return importance.astype(np.float32), raised


def _candidates(layer: int, tensor: str) -> list[str]:
    """Merged 3-D expert weights that hold ``tensor``'s input statistics, best first
    (:data:`MERGED_EXPERTS`).

    >>> _candidates(3, "down_proj")
    ['blk.3.ffn_down_exps.weight']
    """
    return [name.format(L=layer) + ".weight" for name in MERGED_EXPERTS[tensor]]


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
    raise RefusedInput(
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
class _GgufImatrix:
    """The importance matrix of a GGUF file: its keys, and per weight its ``in_sum2`` and
    ``counts`` tensors (the file read by :class:`smoe.interop.gguf_io.GgufReader`)."""

    def __init__(self, view: FileView, gguf: Any) -> None:
        self.view, self.g, self.path = view, gguf, view.path
        self.reader = GgufReader(view, gguf)

    def parse(self) -> tuple[list[_Entry], list[str], int, int]:
        g, reader = self.g, self.reader
        _, n_tensors, n_kv = reader.header()
        keep = {
            g.Keys.General.TYPE,
            g.Keys.General.ALIGNMENT,
            g.Keys.IMatrix.DATASETS,
            g.Keys.IMatrix.CHUNK_COUNT,
            g.Keys.IMatrix.CHUNK_SIZE,
        }
        kv = reader.key_values(n_kv, keep, on_key=self._on_key)
        if g.Keys.General.TYPE not in kv:
            self.check_type(kv)
        alignment = reader.alignment(kv)
        datasets = self.datasets(kv)
        chunk_count = self.u32_key(kv, g.Keys.IMatrix.CHUNK_COUNT)
        chunk_size = self.u32_key(kv, g.Keys.IMatrix.CHUNK_SIZE)
        if n_tensors == 0:
            raise RefusedInput(
                f"{self.path}: holds no tensors (an importance matrix has an "
                "in_sum2 and a counts tensor per weight)"
            )
        infos = reader.tensor_infos(n_tensors, alignment)
        return self.entries(infos), datasets, chunk_count, chunk_size

    # -- the keys --
    def _on_key(self, key: str, kv: dict[str, KeyValue]) -> None:
        """A wrong general.type is refused as soon as it is read."""
        if key == self.g.Keys.General.TYPE:
            self.check_type(kv)

    def check_type(self, kv: dict[str, KeyValue]) -> None:
        g = self.g
        key = g.Keys.General.TYPE
        if key not in kv:
            raise RefusedInput(
                f"{self.path}: not a llama.cpp importance matrix: no {key} key "
                f"(llama-imatrix writes {key} = {g.GGUFType.IMATRIX})"
            )
        value = self.reader.expect(kv, key, g.GGUFValueType.STRING, "a STRING")
        if value != g.GGUFType.IMATRIX:
            raise RefusedInput(
                f"{self.path}: not a llama.cpp importance matrix: {key} at offset "
                f"{kv[key].at} is {value!r}, expected {g.GGUFType.IMATRIX!r} (a GGUF model "
                "is not an importance matrix; llama-imatrix makes one)"
            )

    def missing(self, key: str) -> NoReturn:
        k = self.g.Keys.IMatrix
        raise RefusedInput(
            f"{self.path}: has no {key} key (llama-imatrix writes {k.DATASETS}, "
            f"{k.CHUNK_COUNT} and {k.CHUNK_SIZE}; llama-quantize refuses a file "
            "without them)"
        )

    def u32_key(self, kv: dict[str, KeyValue], key: str) -> int:
        if key not in kv:
            self.missing(key)
        return int(self.reader.expect(kv, key, self.g.GGUFValueType.UINT32, "UINT32"))

    def datasets(self, kv: dict[str, KeyValue]) -> list[str]:
        key = self.g.Keys.IMatrix.DATASETS
        if key not in kv:
            self.missing(key)
        vt = self.g.GGUFValueType
        return list(self.reader.expect(kv, key, (vt.ARRAY, vt.STRING), "an array of STRING"))

    # -- the tensors --
    def entries(self, infos: dict[str, Tensor]) -> list[_Entry]:
        """One entry per weight, in name order, each checked whole."""
        out = [self._entry(base, parts, infos) for base, parts in sorted(_groups(infos).items())]
        if not out:
            raise RefusedInput(
                f"{self.path}: has no in_sum2/counts tensors: not a llama.cpp importance matrix"
            )
        return out

    def _entry(self, base: str, parts: dict[str, str], infos: dict[str, Tensor]) -> _Entry:
        """Weight ``base``'s entry: F32 ``in_sum2`` ``[values per matrix, matrices]`` and
        ``counts`` (one per matrix), ``in_sum`` (unused) as large as ``in_sum2``."""
        self._require_pair(base, parts)
        f32 = self.g.GGMLQuantizationType.F32
        for name in parts.values():
            at, ttype, _, _ = infos[name]
            if ttype != f32:
                raise RefusedInput(
                    f"{self.path}: tensor {name!r} at offset {at} is {ttype.name}, expected F32"
                )
        s_at, _, s_ne, s_off = infos[parts[".in_sum2"]]
        c_at, _, c_ne, c_off = infos[parts[".counts"]]
        size, n_counts = math.prod(s_ne), math.prod(c_ne)
        if not size or not n_counts:
            name, at = (parts[".in_sum2"], s_at) if not size else (parts[".counts"], c_at)
            raise RefusedInput(f"{self.path}: tensor {name!r} at offset {at} holds no values")
        if len(s_ne) > 2 or size % n_counts or (len(s_ne) == 2 and s_ne[1] != n_counts):
            raise RefusedInput(
                f"{self.path}: tensor {parts['.in_sum2']!r} has ne {list(s_ne)} "
                f"but {parts['.counts']!r} holds {n_counts} counts (in_sum2 is "
                "[values per matrix, matrices], one count per matrix)"
            )
        if ".in_sum" in parts:
            i_at, _, i_ne, _ = infos[parts[".in_sum"]]
            if math.prod(i_ne) != size:
                raise RefusedInput(
                    f"{self.path}: tensor {parts['.in_sum']!r} at offset {i_at} "
                    f"has ne {list(i_ne)}, in_sum2 {list(s_ne)}"
                )
        return _Entry(
            base,
            f"tensor {parts['.in_sum2']!r}",
            s_off,
            size,
            self._counts(parts[".counts"], c_off, n_counts),
            legacy=False,
            file_cols=size // n_counts if n_counts > 1 else None,
        )

    def _require_pair(self, base: str, parts: dict[str, str]) -> None:
        """in_sum2 and counts, both; the message names the one there and the one missing."""
        if ".in_sum2" in parts and ".counts" in parts:
            return
        has, lacks = (
            (".in_sum2", ".counts")
            if ".in_sum2" in parts
            else ((".counts", ".in_sum2") if ".counts" in parts else (".in_sum", ".in_sum2"))
        )
        raise RefusedInput(
            f"{self.path}: tensor {base + has!r} has no {base + lacks!r} "
            "beside it (llama-imatrix writes in_sum2 and counts per weight)"
        )

    def _counts(self, name: str, offset: int, n: int) -> np.ndarray:
        """The ``n`` counts at ``offset`` (float64), each a whole number >= 0."""
        counts = self.view.read(offset, 4 * n).view("<f4").astype(np.float64)
        bad = ~np.isfinite(counts) | (counts < 0) | (counts != np.round(counts))
        if bad.any():
            i = int(np.argmax(bad))
            raise RefusedInput(
                f"{self.path}: tensor {name!r} holds "
                f"{float(counts[i])!r} at offset {offset + 4 * i} (matrix {i}): "
                "counts are whole numbers >= 0"
            )
        return counts


def _groups(infos: dict[str, Tensor]) -> dict[str, dict[str, str]]:
    """Weight name -> its tensors by suffix (``.in_sum2``, ``.counts``, ``.in_sum``)."""
    groups: dict[str, dict[str, str]] = {}
    for name in infos:
        for suffix in (".in_sum2", ".counts", ".in_sum"):
            if name.endswith(suffix) and len(name) > len(suffix):
                groups.setdefault(name[: -len(suffix)], {})[suffix] = name
                break
    return groups


# ---- the legacy form ------------------------------------------------------------------------
def _parse_legacy(view: FileView) -> tuple[list[_Entry], list[str], int | None]:
    """Entries, dataset names and chunk count of a legacy ``.dat`` file, every count bounded
    by the bytes left before it is used."""
    legacy = _Legacy(view)
    entries = [legacy.entry(i) for i in range(legacy.entry_count())]
    chunk_count = legacy.chunk_count()
    datasets = legacy.datasets()
    legacy.end()
    return entries, datasets, chunk_count


class _Legacy:
    """A legacy ``.dat`` file read front to back (``pos``: where the next field starts)."""

    def __init__(self, view: FileView) -> None:
        self.view, self.path, self.size = view, view.path, view.size
        self.pos = 0
        self.seen: dict[str, int] = {}  # name -> offset of its entry

    def i32(self, at: int) -> int:
        return int(struct.unpack("<i", bytes(self.view.read(at, 4)))[0])

    def entry_count(self) -> int:
        path, size = self.path, self.size
        n = self.i32(0)
        # each entry needs at least 17 bytes: name length, a 1-byte name, ncall, nval, a value
        if n < 1 or n * 17 > size - 4:
            raise RefusedInput(
                f"{path}: not a llama.cpp importance matrix: no GGUF magic, and as a "
                f"legacy .dat file its entry count {n} at offset 0 "
                f"{'is not positive' if n < 1 else f'cannot fit in {size} bytes'}"
            )
        self.pos = 4
        return n

    def entry(self, i: int) -> _Entry:
        """Entry ``i``: its name, ``ncall`` and ``nval``, its values left in the file."""
        path, size = self.path, self.size
        at = self.pos
        name = self._name(i)
        pos = self.pos
        if size - pos < 8:
            raise RefusedInput(
                f"{path}: legacy entry {i} ({name!r}) at offset {at} is cut off "
                f"after its name: the file ends at offset {size}"
            )
        ncall, nval = self.i32(pos), self.i32(pos + 4)
        if ncall < 0:
            raise RefusedInput(
                f"{path}: legacy entry {i} ({name!r}) has ncall {ncall} at offset "
                f"{pos}; it counts chunks, >= 0"
            )
        if nval < 1 or 4 * nval > size - pos - 8:
            raise RefusedInput(
                f"{path}: legacy entry {i} ({name!r}) has nval {nval} at offset "
                f"{pos + 4}; {size - pos - 8} bytes are left for its values"
            )
        pos += 8
        self.seen[name] = at
        self.pos = pos + 4 * nval
        return _Entry(
            name, f"legacy entry {name!r}", pos, nval, np.array([ncall], np.float64), legacy=True
        )

    def _name(self, i: int) -> str:
        """Entry ``i``'s name: UTF-8, no NUL, not seen before."""
        path, size, pos = self.path, self.size, self.pos
        if size - pos < 12:
            raise RefusedInput(
                f"{path}: legacy entry {i} at offset {pos} is cut off: the file ends "
                f"at offset {size} (truncated?)"
            )
        length = self.i32(pos)
        if length < 1 or length > size - pos - 12:
            raise RefusedInput(
                f"{path}: legacy entry {i} at offset {pos} has a name length of "
                f"{length}; {size - pos - 12} bytes are left for the name and values"
                + (" (not an importance matrix?)" if i == 0 else "")
            )
        raw = bytes(self.view.read(pos + 4, length))
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RefusedInput(
                f"{path}: legacy entry {i} at offset {pos} has a name that is not "
                f"valid UTF-8 (byte 0x{raw[e.start]:02x} at offset "
                f"{pos + 4 + e.start})"
            ) from None
        if "\0" in name:
            raise RefusedInput(
                f"{path}: legacy entry {i} ({name!r}) at offset {pos} has a NUL byte in its name"
            )
        if name in self.seen:
            raise RefusedInput(
                f"{path}: legacy entry {i} at offset {pos} names {name!r} again "
                f"(first at offset {self.seen[name]})"
            )
        self.pos = pos + 4 + length
        return name

    def chunk_count(self) -> int | None:
        """The optional chunk count after the entries (None: the file ends there)."""
        path, size, pos = self.path, self.size, self.pos
        if pos >= size:
            return None
        if size - pos < 4:
            raise RefusedInput(
                f"{path}: {size - pos} bytes at offset {pos} after the last entry "
                "are too few for the chunk count (4 bytes; truncated?)"
            )
        chunk_count = self.i32(pos)
        if chunk_count < 0:
            raise RefusedInput(f"{path}: chunk count {chunk_count} at offset {pos} is negative")
        self.pos = pos + 4
        return chunk_count

    def datasets(self) -> list[str]:
        """The optional dataset name after the chunk count (as it decodes, up to a NUL)."""
        path, size, pos = self.path, self.size, self.pos
        if pos >= size:
            return []
        if size - pos < 4:
            raise RefusedInput(
                f"{path}: {size - pos} bytes at offset {pos} after the chunk count "
                "are too few for the dataset name's length (truncated?)"
            )
        length = self.i32(pos)
        if length < 0 or length > size - pos - 4:
            raise RefusedInput(
                f"{path}: dataset name length {length} at offset {pos}; "
                f"{size - pos - 4} bytes are left"
            )
        raw = bytes(self.view.read(pos + 4, length)).split(b"\0", 1)[0]
        self.pos = pos + 4 + length
        return [raw.decode("utf-8", "replace")] if raw else []

    def end(self) -> None:
        """Nothing may follow the dataset name."""
        if self.pos < self.size:
            raise RefusedInput(
                f"{self.path}: {self.size - self.pos} bytes at offset {self.pos} after the "
                "dataset name belong to nothing"
            )
