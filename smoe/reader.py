"""The fast reader: a vault read with ``pread`` and viewed through the generated dtypes.

``Vault.open`` opens the file (regular files only), reads the header, the arch block and
the table with its descriptors in a few reads bounded by the file size, runs the header,
arch and table checks (vectorised; no per-entry Python objects) and builds the (layer,
expert) lookup as a sorted key array. ``vault.expert(layer, expert)`` checks that expert's
descriptors and reads its tensors with one ``pread``; ``dequantize()`` decodes them. A
file that shrinks under the reader gives a :class:`SmoeError`, never a signal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smoe import quant
from smoe.errors import SmoeError
from smoe.findings import Finding
from smoe.plan import TENSOR_NAMES
from smoe.verify import Report, check_arch, check_descriptors, check_header, check_table
from smoe.view import Data, FileView, Geometry, arch_view, header_view, table_views
from smoe_gen import layout


class VaultError(SmoeError):
    """The file is not a readable vault; ``finding`` says which rule, where."""

    def __init__(self, path: Path, finding: Finding) -> None:
        super().__init__(f"{path}: {finding.code} at offset {finding.offset} ({finding.path}): "
                         f"{finding.message}")
        self.finding = finding


@dataclass(frozen=True)
class TensorView:
    """One weight matrix of an expert: read-only views into the expert's bytes."""

    name: str
    rows: int
    cols: int
    bits: int
    packed: np.ndarray  # uint8
    scales: np.ndarray  # little-endian float16

    def dequantize(self) -> np.ndarray:
        return quant.decode(self.packed, self.scales, self.bits, (self.rows, self.cols))


@dataclass(frozen=True)
class ExpertView:
    layer_id: int
    expert_id: int
    index: int
    tensors: tuple[TensorView, TensorView, TensorView]

    def __getitem__(self, name: str) -> TensorView:
        return self.tensors[TENSOR_NAMES.index(name)]

    def dequantize(self) -> dict[str, np.ndarray]:
        return {t.name: t.dequantize() for t in self.tensors}


class Vault:
    """A read-only vault: header, arch, table and descriptors in memory, blobs on demand."""

    def __init__(self, path: Path, data: Data, geo: Geometry, report: Report,
                 header: np.void, table: np.ndarray, descriptors: np.ndarray) -> None:
        self.path = path
        self.data = data  # FileView (or an array): data[a:b] reads, len(data) = file size
        self.geometry = geo
        self.report = report  # findings of the checks run at open (warnings, info)
        self.header = header
        self.arch = arch_view(data, geo) if geo.version >= layout.VERSION_WITH_ARCH else None
        self.table, self.descriptors = table, descriptors
        self._checked: set[int] = set()
        self._keys = ((self.table["layer_id"].astype(np.uint64) << np.uint64(32))
                      | self.table["expert_id"].astype(np.uint64))

    @classmethod
    def open(cls, path: str | os.PathLike) -> Vault:
        """Open and check a vault file; ``fileio.NotRegular`` for FIFOs, folders, devices."""
        view = FileView.open(path)
        try:
            return cls.from_array(view, view.path)
        except BaseException:
            view.close()
            raise

    @classmethod
    def from_array(cls, data: Data, path: Path | str = "<memory>") -> Vault:
        """A vault over an opened :class:`FileView` or an in-memory uint8 array."""
        path = Path(path)
        report = Report(size=len(data))
        if len(data) < layout.HEADER_SIZE:
            raise VaultError(path, Finding("error", "header.size", 0, "header",
                                           f"file of {len(data)} bytes is shorter than the "
                                           "64-byte header", layout.HEADER_SIZE, len(data)))
        geo = check_header(data, report)
        if geo is not None and geo.version >= layout.VERSION_WITH_ARCH and geo.arch_readable:
            check_arch(data, geo, report)
        if geo is None or report.errors or not geo.table_readable:
            raise VaultError(path, report.errors[0])
        header = header_view(data)
        table, descriptors = table_views(data, geo)
        check_table(table, geo, report, header)
        if report.errors:
            raise VaultError(path, report.errors[0])
        return cls(path, data, geo, report, header, table, descriptors)

    def close(self) -> None:
        """Close the file (a closed vault's lookups still work; expert reads do not)."""
        if isinstance(self.data, FileView):
            self.data.close()

    def __enter__(self) -> Vault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- lookup ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.table)

    @property
    def bits(self) -> int:
        return int(self.header["bits"])

    def index(self, layer: int, expert: int) -> int:
        """Table index of (layer, expert); KeyError if the vault does not hold it."""
        key = np.uint64((int(layer) << 32) | int(expert))
        i = int(np.searchsorted(self._keys, key))
        if i >= len(self._keys) or self._keys[i] != key:
            raise KeyError(f"{self.path}: no expert (layer {layer}, expert {expert})")
        return i

    def __contains__(self, key: tuple[int, int]) -> bool:
        try:
            self.index(*key)
        except KeyError:
            return False
        return True

    def __iter__(self):
        """(layer, expert) of every entry, in table order."""
        return iter(self.keys())

    def keys(self) -> list[tuple[int, int]]:
        return [(int(k >> np.uint64(32)), int(k & np.uint64(0xFFFFFFFF))) for k in self._keys]

    def layers(self) -> dict[int, int]:
        """layer_id -> number of experts stored."""
        ids, counts = np.unique(self.table["layer_id"], return_counts=True)
        return {int(i): int(c) for i, c in zip(ids, counts)}

    def expert(self, layer: int, expert: int) -> ExpertView:
        """One expert's tensors, read with one ``pread``; its descriptors are checked first."""
        i = self.index(layer, expert)
        if i not in self._checked:
            report = Report(size=len(self.data))
            check_descriptors(self.table, self.descriptors, self.geometry, report, self.header,
                              self.arch, i, i + 1)
            if report.errors:
                raise VaultError(self.path, report.errors[0])
            self._checked.add(i)
        e = self.table[i]
        d = self.descriptors[i]
        starts = np.concatenate([d["packed_offset"], d["scales_offset"]]).astype(np.int64)
        ends = starts + np.concatenate([d["packed_size"], d["scales_size"]]).astype(np.int64)
        lo = int(starts.min())
        base = int(e["byte_offset"]) + lo
        blob = self.data[base : base + int(ends.max()) - lo]  # the span of the six slices
        views = []
        for t, name in enumerate(TENSOR_NAMES):
            p0, s0 = int(starts[t]) - lo, int(starts[3 + t]) - lo
            views.append(TensorView(
                name, int(d[t]["rows"]), int(d[t]["cols"]), self.bits,
                blob[p0 : p0 + int(d[t]["packed_size"])],
                blob[s0 : s0 + int(d[t]["scales_size"])].view("<f2")))
        return ExpertView(int(e["layer_id"]), int(e["expert_id"]), i, tuple(views))  # type: ignore[arg-type]
