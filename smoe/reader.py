"""The fast reader: a vault memory-mapped and viewed through the generated numpy dtypes.

``Vault.open`` maps the file, bounds every count and offset by the file size, runs the
header, arch and table checks (vectorised; no per-entry Python objects) and builds the
(layer, expert) lookup as a sorted key array. ``vault.expert(layer, expert)`` gives
zero-copy views of one expert's packed codes and scales, and ``dequantize()``.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smoe import quant
from smoe.errors import SmoeError
from smoe.findings import Finding
from smoe.plan import TENSOR_NAMES
from smoe.verify import (
    Geometry,
    Report,
    arch_record,
    check_arch,
    check_descriptors,
    check_header,
    check_table,
    table_views,
)
from smoe_gen import layout


def map_file(path: Path) -> np.ndarray:
    """The whole file as a read-only, memory-mapped uint8 array (zero-copy)."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return np.zeros(0, np.uint8)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise SmoeError(f"{path}: cannot open ({e.strerror})") from None
    return np.frombuffer(mm, np.uint8)


class VaultError(SmoeError):
    """The file is not a readable vault; ``finding`` says which rule, where."""

    def __init__(self, path: Path, finding: Finding) -> None:
        super().__init__(f"{path}: {finding.code} at offset {finding.offset} ({finding.path}): "
                         f"{finding.message}")
        self.finding = finding


@dataclass(frozen=True)
class TensorView:
    """One weight matrix of an expert: views into the mapped file."""

    name: str
    rows: int
    cols: int
    bits: int
    packed: np.ndarray  # uint8, zero-copy
    scales: np.ndarray  # little-endian float16, zero-copy

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
    """A read-only, memory-mapped vault."""

    def __init__(self, path: Path, data: np.ndarray, geo: Geometry, report: Report) -> None:
        self.path = path
        self.data = data
        self.geometry = geo
        self.report = report  # findings of the checks run at open (warnings, info)
        self.header = data[: layout.HEADER_SIZE].view(layout.HEADER_DTYPE)[0]
        self.arch = (arch_record(data, geo) if geo.version >= layout.VERSION_WITH_ARCH
                     else None)
        self.table, self.descriptors = table_views(data, geo)
        self._checked: set[int] = set()
        self._keys = ((self.table["layer_id"].astype(np.uint64) << np.uint64(32))
                      | self.table["expert_id"].astype(np.uint64))

    @classmethod
    def open(cls, path: str | os.PathLike) -> Vault:
        path = Path(path)
        return cls.from_array(map_file(path), path)

    @classmethod
    def from_array(cls, data: np.ndarray, path: Path | str = "<memory>") -> Vault:
        path = Path(path)
        report = Report(size=len(data))
        if len(data) < layout.HEADER_SIZE:
            raise VaultError(path, Finding("error", "header.size", 0, "header",
                                           f"file of {len(data)} bytes is shorter than the "
                                           "64-byte header", layout.HEADER_SIZE, len(data)))
        geo = check_header(data, report)
        if geo is not None and geo.version >= layout.VERSION_WITH_ARCH and geo.arch_readable:
            check_arch(data, geo, report)
        if geo is not None and geo.table_readable and not report.errors:
            header = data[: layout.HEADER_SIZE].view(layout.HEADER_DTYPE)[0]
            check_table(data, geo, report, header)
        if report.errors or geo is None:
            raise VaultError(path, report.errors[0])
        return cls(path, data, geo, report)

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
        """Zero-copy views of one expert's tensors; its descriptors are checked first."""
        i = self.index(layer, expert)
        if i not in self._checked:
            report = Report(size=len(self.data))
            check_descriptors(self.data, self.geometry, report, self.header, self.arch, i, i + 1)
            if report.errors:
                raise VaultError(self.path, report.errors[0])
            self._checked.add(i)
        e = self.table[i]
        off = int(e["byte_offset"])
        views = []
        for t, name in enumerate(TENSOR_NAMES):
            d = self.descriptors[i, t]
            p0, s0 = off + int(d["packed_offset"]), off + int(d["scales_offset"])
            views.append(TensorView(
                name, int(d["rows"]), int(d["cols"]), self.bits,
                self.data[p0 : p0 + int(d["packed_size"])],
                self.data[s0 : s0 + int(d["scales_size"])].view("<f2")))
        return ExpertView(int(e["layer_id"]), int(e["expert_id"]), i, tuple(views))  # type: ignore[arg-type]
