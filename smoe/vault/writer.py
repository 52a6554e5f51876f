"""VaultWriter: declare experts, plan the layout, stream blobs, commit atomically.

The writer is an explicit state machine::

    DECLARING --begin()--> STREAMING --commit()--> COMMITTED
        |                      |
        +-------abort()--------+-----------------> ABORTED

* ``add_expert`` (DECLARING) records an expert's three shapes; order does not matter,
  the table is sorted by (layer, expert), so any order gives the same bytes.
* ``begin`` plans every offset (``smoe.format.plan``) and creates a temporary file of the
  final size in the target directory.
* ``write_expert`` / ``write_encoded`` (STREAMING) put one blob at its planned offset
  (every write checked: :func:`smoe.plumbing.fileio.pwrite_all`) and record its CRC-32C;
  ``adopt`` records a blob another process wrote, with its provenance.
* ``commit`` writes header, table, descriptors and arch block, stages the integrity
  manifest (``<vault>.manifest.json``, docs/MANIFEST.md; ``manifest=False`` skips it),
  fsyncs every file, renames the companions given to it (e.g. the scout), then the
  manifest, then the vault LAST, and fsyncs the directory. The vault's appearance is
  the commit point: if a rename fails, the companions already renamed are removed again,
  so the vault, its manifest and its companions appear together or not at all. Until
  then nothing exists under the final names; ``abort`` (also on any exception inside
  ``with``) removes the temporary files.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from smoe.errors import FormatError, RefusedInput, SmoeError, WriterStateError
from smoe.format.manifest import ManifestBuilder, checksum, encode, path_for, tool_info
from smoe.format.plan import ExpertSlot, Plan, Shape, make_plan
from smoe.format.records import U32_MAX, VAULT_SIGNATURE, ArchInfo, ModelInfo, metadata_bytes
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile
from smoe.plumbing.atomic_group import commit_together
from smoe.vault.blob import MatrixInput, encode_blob, expert_name
from smoe.vault.meta import check_metadata
from smoe_gen import layout
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["State", "VaultWriter", "write_vault"]


class State(enum.Enum):
    """Where a :class:`VaultWriter` is in its protocol (see the module docstring).

    >>> import tempfile
    >>> from smoe.format.records import ModelInfo
    >>> w = VaultWriter(tempfile.mkdtemp() + "/tiny.smoe", ModelInfo(1, 1, 64, 128, 32), version=1)
    >>> w.state
    <State.DECLARING: 'declaring'>
    >>> w.abort(); w.state
    <State.ABORTED: 'aborted'>
    """

    DECLARING = "declaring"
    STREAMING = "streaming"
    COMMITTED = "committed"
    ABORTED = "aborted"


class VaultWriter:
    """Writes one vault; see the module docstring for the protocol.

    >>> import os, tempfile, numpy as np
    >>> from smoe.format.records import ModelInfo
    >>> model = ModelInfo(
    ...     num_moe_layers=1, max_experts_per_layer=2, d_model=64, vocab_size=128, ffn_dim=32
    ... )
    >>> rng = np.random.default_rng(0)
    >>> shapes = [(32, 64), (32, 64), (64, 32)]
    >>> gate, up, down = (rng.standard_normal(s, np.float32) for s in shapes)
    >>> out = tempfile.mkdtemp()
    >>> with VaultWriter(f"{out}/tiny.smoe", model, version=1) as w:
    ...     for e in (1, 0):  # any order: the table is sorted
    ...         w.add_expert(0, e, [gate.shape, up.shape, down.shape])
    ...     plan = w.begin()
    ...     for e in (0, 1):
    ...         w.write_expert(0, e, [gate, up, down])
    ...     w.commit().name
    'tiny.smoe'
    >>> sorted(os.listdir(out)), plan.file_size
    (['tiny.smoe', 'tiny.smoe.manifest.json'], 49152)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        model: ModelInfo,
        *,
        bits: int = layout.BITS_Q4,
        version: int = layout.VERSION_MAX,
        arch: ArchInfo | None = None,
        scale: str = "optimal",
        partial: str | os.PathLike | None = None,
        manifest: bool = True,
        tool: dict[str, Any] | None = None,
        source: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
        replace: bool = True,
    ) -> None:
        """``partial``: a fixed temporary path (for resumable writes); default a fresh one.

        ``replace``: an existing vault at ``path`` is replaced at commit (False: it is
        refused at :meth:`begin` and never replaced at commit,
        :class:`~smoe.errors.OutputExists`; its companions are replaced either way).

        ``manifest``: write ``<vault>.manifest.json`` beside the vault at commit (False: none,
        and one left there by an older vault is removed); ``tool`` and ``source`` are its
        provenance (default: this writer and its options, no source); ``metadata`` its
        free-form ``metadata`` (checked by :func:`smoe.vault.meta.check_metadata`).
        Neither may hold time stamps or absolute paths: the manifest's bytes must depend on
        the vault's content only.
        """
        if bits not in layout.SUPPORTED_BITS:
            raise FormatError(f"bits: {bits} is not one of {list(layout.SUPPORTED_BITS)}")
        if not layout.VERSION_MIN <= version <= layout.VERSION_MAX:
            raise FormatError(
                f"version: {version} is outside {layout.VERSION_MIN}..{layout.VERSION_MAX}"
            )
        model.check()
        if version >= layout.VERSION_WITH_ARCH:
            if arch is None:
                raise FormatError(f"version {version} needs an arch block (arch=ArchInfo(...))")
            arch.check()
            if arch.num_hidden_layers < model.num_moe_layers:
                raise FormatError(
                    f"arch.num_hidden_layers: {arch.num_hidden_layers} is less than "
                    f"num_moe_layers {model.num_moe_layers} (the arch block counts every "
                    "layer; it has no field for multi-token-prediction layers)"
                )
        self.path = Path(path)
        self.model = model
        self.bits = bits
        self.version = version
        self.arch = arch if version >= layout.VERSION_WITH_ARCH else None
        self.scale = scale
        self.state = State.DECLARING
        self._shapes: dict[tuple[int, int], tuple[Shape, Shape, Shape]] = {}
        self._layer_shapes: dict[int, tuple[Shape, Shape, Shape]] = {}
        self._plan: Plan | None = None
        self._index: dict[tuple[int, int], int] = {}
        self._written: set[tuple[int, int]] = set()
        self._out: AtomicFile | None = None
        self._partial = Path(partial) if partial is not None else None
        self._replace = replace
        self._manifest: ManifestBuilder | None = None
        if manifest:
            self._manifest = ManifestBuilder(
                tool
                if tool is not None
                else tool_info("VaultWriter", {"bits": bits, "version": version, "scale": scale}),
                source,
                check_metadata(metadata) if metadata else None,
            )
            _check_provenance(self._manifest)

    # ---- state handling ---------------------------------------------------------------
    def _require(self, *states: State, action: str) -> None:
        if self.state not in states:
            allowed = " or ".join(s.value for s in states)
            raise WriterStateError(
                f"{action}: the writer is {self.state.value}, it must be {allowed}"
            )

    def __enter__(self) -> VaultWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state not in (State.COMMITTED, State.ABORTED):
            self.abort()

    # ---- DECLARING ------------------------------------------------------------------------
    def add_expert(self, layer: int, expert: int, shapes: Sequence[Sequence[int]]) -> None:
        """Declare an expert with its gate, up and down shapes (checked against the model).

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> w.add_expert(0, 1, [(32, 64), (32, 64), (32, 64)])
        Traceback (most recent call last):
        smoe.errors.FormatError: layer 0 expert 1: down_proj shape (32, 64) is not the transpose \
of gate_proj shape (32, 64)
        >>> w.abort()
        """
        self._require(State.DECLARING, action="add_expert")
        name = expert_name(layer, expert)
        for what, value in (("layer_id", layer), ("expert_id", expert)):
            if not isinstance(value, (int, np.integer)) or not 0 <= value <= U32_MAX:
                raise FormatError(f"{name}: {what} {value!r} is not a uint32")
        if expert >= self.model.max_experts_per_layer:
            raise FormatError(
                f"{name}: expert_id must be below max_experts_per_layer "
                f"{self.model.max_experts_per_layer}"
            )
        key = (int(layer), int(expert))
        if key in self._shapes:
            raise FormatError(f"{name}: added twice (duplicate (layer_id, expert_id))")
        norm = self._check_shapes(name, shapes)
        if layer not in self._layer_shapes and (
            len(self._layer_shapes) >= self.model.num_moe_layers
        ):
            raise FormatError(
                f"{name}: more MoE layers than num_moe_layers {self.model.num_moe_layers}"
            )
        first = self._layer_shapes.setdefault(key[0], norm)
        if first != norm:
            raise FormatError(
                f"{name}: shapes {list(norm)} differ from the other experts of "
                f"layer {layer} {list(first)}"
            )
        self._shapes[key] = norm

    def _check_shapes(
        self, name: str, shapes: Sequence[Sequence[int]]
    ) -> tuple[Shape, Shape, Shape]:
        if len(shapes) != layout.TENSORS_PER_EXPERT:
            raise FormatError(
                f"{name}: expected {layout.TENSORS_PER_EXPERT} shapes "
                f"(gate, up, down), got {len(shapes)}"
            )
        norm: list[Shape] = []
        for tname, shape in zip(TENSOR_NAMES, shapes):
            dims = tuple(int(d) for d in shape)
            if len(dims) != layout.TENSOR_NDIM or not all(1 <= d <= U32_MAX for d in dims):
                raise FormatError(
                    f"{name}: {tname} shape {dims} is not 2-D with positive uint32 dimensions"
                )
            norm.append((dims[0], dims[1]))
        gate, up, down = norm
        if up != gate:
            raise FormatError(f"{name}: up_proj shape {up} differs from gate_proj shape {gate}")
        if down != (gate[1], gate[0]):
            raise FormatError(
                f"{name}: down_proj shape {down} is not the transpose of gate_proj shape {gate}"
            )
        if gate[1] != self.model.d_model:
            raise FormatError(
                f"{name}: gate_proj has {gate[1]} columns, d_model is {self.model.d_model}"
            )
        if self.arch is not None and gate[0] != self.arch.moe_ffn_dim:
            raise FormatError(
                f"{name}: gate_proj has {gate[0]} rows, arch.moe_ffn_dim is {self.arch.moe_ffn_dim}"
            )
        return norm[0], norm[1], norm[2]

    def begin(self, keep: bool = False) -> Plan:
        """Plan the layout and create the temporary file; returns the plan.

        ``keep``: reuse the bytes already in the ``partial`` file (resuming); blobs found
        intact there are declared with :meth:`adopt`.

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> w.begin().file_size, w.state
        (32768, <State.STREAMING: 'streaming'>)
        >>> w.abort()
        """
        self._require(State.DECLARING, action="begin")
        plan = make_plan(self._shapes, self.bits, self.version)
        self._out = AtomicFile(
            self.path, tmp=self._partial, replace=self._replace, ours=VAULT_SIGNATURE
        )
        try:
            if not keep:
                self._out.truncate(0)
            self._out.truncate(plan.file_size)  # holes read as zeros: the padding
        except BaseException:
            self.abort()
            raise
        self._plan = plan
        self._index = plan.index()
        self.state = State.STREAMING
        return plan

    # ---- STREAMING ----------------------------------------------------------------------
    @property
    def _fd(self) -> int:
        assert self._out is not None and self._out.fd is not None
        return self._out.fd

    @property
    def plan(self) -> Plan:
        """The layout :meth:`begin` planned.

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> w.plan
        Traceback (most recent call last):
        smoe.errors.WriterStateError: plan: the layout is planned by begin()
        >>> w.begin() is w.plan, w.plan.experts[0].byte_offset
        (True, 16384)
        >>> w.abort()
        """
        if self._plan is None:
            raise WriterStateError("plan: the layout is planned by begin()")
        return self._plan

    def _slot(self, layer: int, expert: int) -> tuple[tuple[int, int], ExpertSlot]:
        self._require(State.STREAMING, action="write")
        key = (int(layer), int(expert))
        if key not in self._index:
            raise WriterStateError(f"{expert_name(layer, expert)}: not declared with add_expert")
        if key in self._written:
            raise WriterStateError(f"{expert_name(layer, expert)}: written twice")
        return key, self.plan.experts[self._index[key]]

    def write_expert(
        self, layer: int, expert: int, weights: Sequence[np.ndarray], src_dtype: str | None = None
    ) -> None:
        """Quantise an expert's gate, up and down matrices and write its blob.

        ``src_dtype``: as for :func:`smoe.quant.encode` (``"bf16"`` for raw bfloat16 bits).

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> import numpy as np
        >>> w.write_expert(0, 0, [np.ones((32, 64)), np.ones((32, 64)), np.ones((64, 32))])
        >>> w.missing
        []
        >>> w.write_expert(0, 0, [np.ones((32, 64)), np.ones((32, 64)), np.ones((64, 32))])
        Traceback (most recent call last):
        smoe.errors.WriterStateError: layer 0 expert 0: written twice
        >>> w.abort()
        """
        key, slot = self._slot(layer, expert)
        for tname, t, w in zip(TENSOR_NAMES, slot.tensors, weights):
            if tuple(w.shape) != (t.rows, t.cols):
                raise RefusedInput(
                    f"{expert_name(layer, expert)}: {tname} has shape "
                    f"{tuple(w.shape)}, declared {(t.rows, t.cols)}"
                )
        blob = encode_blob(slot, MatrixInput.each(weights, src_dtype), self.bits, self.scale)
        self._write_blob(key, slot, blob)

    def write_encoded(
        self, layer: int, expert: int, encoded: Sequence[tuple[np.ndarray, np.ndarray]]
    ) -> None:
        """Write an expert whose tensors are already encoded as (packed, scales).

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> import numpy as np
        >>> from smoe import quant
        >>> mats = [np.ones((32, 64)), np.ones((32, 64)), np.ones((64, 32))]
        >>> w.write_encoded(0, 0, [quant.encode(m, 4) for m in mats])
        >>> w.missing
        []
        >>> w.abort()
        """
        key, slot = self._slot(layer, expert)
        self._put(key, slot, encoded)

    def _put(
        self,
        key: tuple[int, int],
        slot: ExpertSlot,
        encoded: Sequence[tuple[np.ndarray, np.ndarray]],
    ) -> None:
        name = expert_name(*key)
        blob = bytearray(slot.raw_size)
        for tname, t, (packed, scales) in zip(TENSOR_NAMES, slot.tensors, encoded):
            p = np.ascontiguousarray(packed, np.uint8).tobytes()
            s = np.ascontiguousarray(scales, "<f2").tobytes()
            if len(p) != t.packed_size or len(s) != t.scales_size:
                raise RefusedInput(
                    f"{name}: {tname} encodes to {len(p)} packed + {len(s)} scale "
                    f"bytes, the plan has {t.packed_size} + {t.scales_size}"
                )
            blob[t.packed_offset : t.packed_offset + len(p)] = p
            blob[t.scales_offset : t.scales_offset + len(s)] = s
        self._write_blob(key, slot, blob)

    def _write_blob(self, key: tuple[int, int], slot: ExpertSlot, blob: bytearray) -> None:
        assert self._out is not None
        self._out.pwrite(blob, slot.byte_offset)
        self._record(key, checksum(blob))

    def _record(
        self, key: tuple[int, int], crc: int, tensors: list[dict[str, Any]] | None = None
    ) -> None:
        if self._manifest is not None:
            self._manifest.add(*key, crc, tensors)
        self._written.add(key)

    def adopt(
        self, layer: int, expert: int, crc: int, tensors: list[dict[str, Any]] | None = None
    ) -> None:
        """Count a blob as written: another process put it at its planned offset.

        ``crc``: the blob's CRC-32C; ``tensors``: its provenance for the manifest (per
        tensor ``name``, ``source``, ``index``, ``rows``, ``source_crc32c``, ``snr_db``).

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> w.adopt(0, 0, w.stored_crc(0, 0))  # e.g. found intact when resuming
        >>> w.missing
        []
        >>> w.abort()
        """
        key, _ = self._slot(layer, expert)
        self._record(key, crc, tensors)

    def annotate(self, layer: int, expert: int, tensors: list[dict[str, Any]]) -> None:
        """Replace the manifest's per-tensor provenance of a blob already counted as written
        (its CRC-32C stays): what a calibrated resume learns about the experts it kept only
        once the calibration has reached their layer.

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> w.adopt(0, 0, 7, [{"name": "gate_proj", "snr_db": 9.0}])
        >>> w.annotate(0, 0, [{"name": "gate_proj", "snr_db": 9.0, "calib_tokens": 3}])
        >>> w.abort()
        """
        self._require(State.STREAMING, action="annotate")
        key = (int(layer), int(expert))
        if key not in self._written:
            raise WriterStateError(f"{expert_name(layer, expert)}: annotated before it is written")
        if self._manifest is not None:
            self._manifest.add(*key, self._manifest.experts[key]["crc32c"], tensors)

    def stored_crc(self, layer: int, expert: int) -> int | None:
        """CRC-32C of the blob bytes now in the temporary file (None if it is too short).

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> from smoe.format.manifest import checksum
        >>> w.stored_crc(0, 0) == checksum(bytes(plan.experts[0].raw_size))  # a hole: zeros
        True
        >>> w.abort()
        """
        self._require(State.STREAMING, action="stored_crc")
        slot = self.plan.experts[self._index[(int(layer), int(expert))]]
        try:
            data = fileio.pread_exact(self._fd, slot.raw_size, slot.byte_offset, self.path)
        except SmoeError:
            return None
        return checksum(data)

    @property
    def partial_path(self) -> Path:
        """The temporary file the vault is written in (renamed onto :attr:`path` at commit).

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> w.partial_path.parent == w.path.parent, w.partial_path.name.startswith(".tiny.smoe.")
        (True, True)
        >>> w.abort()
        """
        assert self._out is not None
        return self._out.tmp

    @property
    def partial_identity(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the temporary file, for processes that open it by name.

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> import os
        >>> st = os.stat(w.partial_path)
        >>> w.partial_identity == (st.st_dev, st.st_ino)
        True
        >>> w.abort()
        """
        st = os.fstat(self._fd)
        return st.st_dev, st.st_ino

    @property
    def missing(self) -> list[tuple[int, int]]:
        """(layer, expert) of the declared experts not written (nor adopted) yet, sorted.

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> w.add_expert(0, 1, [(32, 64), (32, 64), (64, 32)])
        >>> w.missing
        [(0, 0), (0, 1)]
        >>> w.abort()
        """
        return [k for k in sorted(self._shapes) if k not in self._written]

    def commit(self, companions: Sequence[AtomicFile] = ()) -> Path:
        """Write the metadata and the manifest, then commit them with ``companions``.

        ``companions`` (staged files, e.g. the scout) are renamed first, then the manifest,
        then the vault (the commit point); see
        :func:`smoe.plumbing.atomic_group.commit_together`. On failure every temporary file
        is removed (on KeyboardInterrupt the vault's is kept, for a resume).

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> w.commit()
        Traceback (most recent call last):
        smoe.errors.WriterStateError: commit: 1 declared experts were not written: layer 0 expert 0
        >>> w.adopt(0, 0, w.stored_crc(0, 0))
        >>> w.commit().name, w.state
        ('tiny.smoe', <State.COMMITTED: 'committed'>)
        """
        self._require(State.STREAMING, action="commit")
        missing = self.missing
        if missing:
            shown = ", ".join(expert_name(*k) for k in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise WriterStateError(
                f"commit: {len(missing)} declared experts were not written: {shown}{more}"
            )
        assert self._out is not None
        staged = list(companions)
        try:
            self._out.pwrite(metadata_bytes(self.plan, self.model, self.arch), 0)
            if self._manifest is not None:
                doc = self._manifest.document(
                    self.path.name,
                    self.plan.file_size,
                    self.bits,
                    (
                        (e.layer_id, e.expert_id, e.byte_offset, e.raw_size)
                        for e in self.plan.experts
                    ),
                )
                staged.append(AtomicFile(path_for(self.path)))
                staged[-1].pwrite(encode(doc), 0)
            else:  # one left by an older vault of this name would describe another file
                fileio.unlink_owned(path_for(self.path))
            commit_together([*staged, self._out])
        except KeyboardInterrupt:
            for f in staged:
                f.abort()
            self.suspend()
            raise
        except BaseException:
            for f in staged:
                f.abort()
            self.abort()
            raise
        self.state = State.COMMITTED
        return self.path

    def suspend(self) -> None:
        """Stop without deleting the ``partial`` file, so a later run can resume it.

        >>> import os, tempfile
        >>> from smoe.format.records import ModelInfo
        >>> d = tempfile.mkdtemp()
        >>> w = VaultWriter(f"{d}/tiny.smoe", ModelInfo(1, 1, 64, 128, 32), version=1,
        ...                 partial=f"{d}/.tiny.smoe.partial")
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> w.suspend(); os.listdir(d)
        ['.tiny.smoe.partial']
        """
        if self._out is not None and self._out.fd is not None:
            os.close(self._out.fd)
            self._out.fd = None
        self.state = State.ABORTED

    def abort(self) -> None:
        """Drop the temporary file; nothing is left under the final name.

        >>> import tempfile
        >>> from smoe.format.records import ModelInfo
        >>> path = tempfile.mkdtemp() + "/tiny.smoe"
        >>> w = VaultWriter(path, ModelInfo(1, 2, 64, 128, 32), version=1)
        >>> w.add_expert(0, 0, [(32, 64), (32, 64), (64, 32)])
        >>> plan = w.begin()
        >>> import os
        >>> w.abort()
        >>> w.state, os.listdir(w.path.parent)
        (<State.ABORTED: 'aborted'>, [])
        """
        if self.state is State.COMMITTED:
            raise WriterStateError("abort: the vault is already committed")
        if self._out is not None:
            self._out.abort()
        self.state = State.ABORTED


def _check_provenance(builder: ManifestBuilder) -> None:
    """Refuse, before anything is written, a tool/source the manifest cannot encode (NaN,
    sets, objects): found at commit, it would fail after every blob was written."""
    try:
        encode({"tool": builder.tool, "source": builder.source, "metadata": builder.metadata})
    except (TypeError, ValueError) as e:
        raise FormatError(
            f"manifest: the tool and source provenance is not strict JSON ({e})"
        ) from None


def write_vault(
    path: str | os.PathLike,
    model: ModelInfo,
    experts: dict[tuple[int, int], Sequence[np.ndarray]],
    *,
    bits: int = layout.BITS_Q4,
    version: int = layout.VERSION_MAX,
    arch: ArchInfo | None = None,
    scale: str = "optimal",
    manifest: bool = True,
    tool: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
) -> Plan:
    """Write a whole vault from in-memory float matrices: (layer, expert) -> (gate, up, down).

    ``manifest``, ``tool``, ``source``: as for :class:`VaultWriter`.

    >>> import tempfile, numpy as np
    >>> from smoe.vault.reader import Vault
    >>> from smoe.format.records import ModelInfo
    >>> rng = np.random.default_rng(0)
    >>> mats = [rng.standard_normal(s, np.float32) for s in ((32, 64), (32, 64), (64, 32))]
    >>> path = tempfile.mkdtemp() + "/tiny.smoe"
    >>> plan = write_vault(path, ModelInfo(1, 1, 64, 128, 32), {(0, 0): mats}, version=1)
    >>> with Vault.open(path) as v:
    ...     v.keys(), v[0, 0]["down_proj"].shape
    ([(0, 0)], (64, 32))
    """
    with VaultWriter(
        path,
        model,
        bits=bits,
        version=version,
        arch=arch,
        scale=scale,
        manifest=manifest,
        tool=tool,
        source=source,
    ) as w:
        for (layer, expert), mats in experts.items():
            w.add_expert(layer, expert, [m.shape for m in mats])
        plan = w.begin()
        for (layer, expert), mats in experts.items():
            w.write_expert(layer, expert, mats)
        w.commit()
    return plan
