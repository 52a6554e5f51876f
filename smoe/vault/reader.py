"""The fast reader: a vault read with ``pread`` and viewed through the generated dtypes.

``Vault.open`` opens the file (regular files only), reads the header, the arch block and
the table with its descriptors in a few reads bounded by the file size, runs the header,
arch and table checks (vectorised; no per-entry Python objects) and builds the (layer,
expert) lookup as a sorted key array. ``vault[layer, expert]`` checks that expert's
descriptors and reads its tensors with one ``pread``; ``np.asarray(tensor)`` or
``tensor.dequantize()`` decodes one of them. ``vault.tensor_names()`` and
``vault.get_tensor(name)`` give the same weights under the names ``smoe export --hf``
writes (as safetensors' ``safe_open`` does). A file that shrinks under the reader gives a
:class:`SmoeError`, never a signal.

>>> import numpy as np
>>> from smoe.vault.reader import Vault
>>> with Vault.open("fixtures/q4_v2.smoe") as v:
...     gate = v[0, 1]["gate_proj"]
>>> w = np.asarray(gate)  # the tensor's bytes were read: this works after close()
>>> w.shape, w.dtype
((32, 64), dtype('float32'))
"""

from __future__ import annotations

import copy
import difflib
import importlib
import operator
import os
import re
import sys
from collections.abc import Iterator, Mapping, ValuesView
from dataclasses import dataclass
from pathlib import Path
from typing import Any, SupportsIndex, TypeVar, overload

import numpy as np
from numpy.typing import DTypeLike

from smoe import quant
from smoe.errors import FormatError
from smoe.format.findings import Finding
from smoe.format.verify import Report, check_arch, check_descriptors, check_header, check_table
from smoe.format.view import Data, FileView, Geometry, arch_view, header_view, table_views
from smoe.interop.safetensors_io import read_header
from smoe.vault import names
from smoe.vault.companions import companions
from smoe.vault.fields import Fields
from smoe.vault.metadata import stored_metadata
from smoe.vault.names import OutTensor
from smoe_gen import layout
from smoe_gen.layout import TENSOR_NAMES, Rule

__all__ = ["ExpertView", "TensorView", "Vault", "VaultError"]

_ID_LIMIT = 1 << 32  # layer and expert ids are u32
_ML_DTYPES_FLOAT = re.compile(r"bfloat16|float[468]_e\w+")  # names ml_dtypes adds to numpy
_T = TypeVar("_T")


class VaultError(FormatError):
    """The file is not a readable vault; ``finding`` says which rule, where.

    >>> import numpy as np
    >>> try:
    ...     Vault.from_array(np.zeros(64, np.uint8), "zeros.smoe")
    ... except VaultError as e:
    ...     print(e.finding.code, e.finding.offset)
    header.magic 0
    """

    def __init__(self, path: Path, finding: Finding) -> None:
        super().__init__(
            f"{path}: {finding.code} at offset {finding.offset} ({finding.path}): {finding.message}"
        )
        self.finding = finding


def _ml_dtypes_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a float type of ``ml_dtypes`` (bfloat16, float8_*)."""
    ml_dtypes = sys.modules.get("ml_dtypes")  # an ml_dtypes dtype implies it is imported
    if ml_dtypes is None or dtype.kind != "V":  # its floats are kind 'V'; its finfo takes complex
        return False
    try:
        ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return False
    return True


def _float_dtype(dtype: DTypeLike) -> np.dtype:
    """The float dtype to dequantise to; a TypeError names what is accepted."""
    accepted = "float16, float32, float64, or bfloat16 with ml_dtypes installed"
    try:
        dt = np.dtype(dtype)
    except TypeError:
        if not (isinstance(dtype, str) and _ML_DTYPES_FLOAT.fullmatch(dtype)):
            raise TypeError(f"cannot dequantize to {dtype!r}: not a dtype ({accepted})") from None
        try:  # "bfloat16" & co. are known to numpy once ml_dtypes is imported
            importlib.import_module("ml_dtypes")
        except ImportError:
            raise TypeError(
                f"cannot dequantize to {dtype!r}: {dtype} needs the ml_dtypes "
                "package (pip install ml-dtypes)"
            ) from None
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"cannot dequantize to {dtype!r}: not a dtype ({accepted})") from None
    if dt.kind == "f" or _ml_dtypes_float(dt):
        return dt
    raise TypeError(f"cannot dequantize to {dt}: not a float dtype ({accepted})")


@dataclass(frozen=True, repr=False)
class TensorView:
    """One weight matrix of an expert: read-only views into the expert's bytes.

    ``np.asarray(tensor)`` and :meth:`dequantize` decode it to a new float array.

    >>> import numpy as np
    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     down = v[1, 2]["down_proj"]
    >>> down
    TensorView('down_proj', 64x32, Q4)
    >>> down.shape, down.packed.nbytes, down.scales.dtype
    ((64, 32), 1024, dtype('float16'))
    >>> np.asarray(down, dtype=np.float16).dtype
    dtype('float16')
    """

    name: str
    rows: int
    cols: int
    bits: int
    packed: np.ndarray  # uint8
    scales: np.ndarray  # little-endian float16

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of the dequantised array.

        >>> Vault.open("fixtures/q4_v2.smoe")[0, 0]["up_proj"].shape
        (32, 64)
        """
        return (self.rows, self.cols)

    def dequantize(self, dtype: DTypeLike = np.float32) -> np.ndarray:
        """The weights as a new ``dtype`` array of :attr:`shape`.

        The format decodes to float32; float16, float64 and (with ``ml_dtypes`` installed)
        ``"bfloat16"`` are cast from it. Other dtypes raise ``TypeError``.

        >>> t = Vault.open("fixtures/q4_v2.smoe")[0, 0]["gate_proj"]
        >>> w = t.dequantize()
        >>> w.dtype, bool((t.dequantize("float16") == w.astype("float16")).all())
        (dtype('float32'), True)
        >>> t.dequantize(np.int8)
        Traceback (most recent call last):
        TypeError: cannot dequantize to int8: not a float dtype (float16, float32, ...)
        """
        dt = _float_dtype(dtype)
        w = quant.decode(self.packed, self.scales, self.bits, self.shape)
        return w if w.dtype == dt else w.astype(dt)

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """``np.asarray(tensor)``: the dequantised array (always new: ``copy=False`` raises)."""
        if copy is False:
            raise ValueError(
                f"{self.name}: a quantised tensor has no float array to view; "
                "decoding always makes one (use copy=None or copy=True)"
            )
        return self.dequantize(np.float32 if dtype is None else dtype)

    def __repr__(self) -> str:
        return f"TensorView({self.name!r}, {self.rows}x{self.cols}, Q{self.bits})"


@dataclass(frozen=True, repr=False)
class ExpertView:
    """One expert's three tensors, by name (``gate_proj``, ``up_proj``, ``down_proj``).

    >>> e = Vault.open("fixtures/q4_v2.smoe")[1, 3]
    >>> e
    ExpertView(layer 1, expert 3: gate_proj 32x64, up_proj 32x64, down_proj 64x32, Q4)
    >>> list(e), len(e), e["up_proj"]
    (['gate_proj', 'up_proj', 'down_proj'], 3, TensorView('up_proj', 32x64, Q4))
    >>> e["gate"]
    Traceback (most recent call last):
    KeyError: "no tensor 'gate' in expert (layer 1, expert 3); it has gate_proj, up_proj, ..."
    """

    layer_id: int
    expert_id: int
    index: int
    tensors: tuple[TensorView, TensorView, TensorView]

    def __getitem__(self, name: str) -> TensorView:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(
            f"no tensor {name!r} in expert (layer {self.layer_id}, expert "
            f"{self.expert_id}); it has {', '.join(self.keys())}"
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.tensors)

    def keys(self) -> tuple[str, ...]:
        """The tensor names, in file order.

        >>> Vault.open("fixtures/q4_v2.smoe")[0, 0].keys()
        ('gate_proj', 'up_proj', 'down_proj')
        """
        return tuple(t.name for t in self.tensors)

    def dequantize(self, dtype: DTypeLike = np.float32) -> dict[str, np.ndarray]:
        """name -> dequantised array, as :meth:`TensorView.dequantize`.

        >>> ws = Vault.open("fixtures/q4_v2.smoe")[0, 0].dequantize()
        >>> {name: w.shape for name, w in ws.items()}
        {'gate_proj': (32, 64), 'up_proj': (32, 64), 'down_proj': (64, 32)}
        """
        dt = _float_dtype(dtype)
        return {t.name: t.dequantize(dt) for t in self.tensors}

    def __repr__(self) -> str:
        shapes = ", ".join(f"{t.name} {t.rows}x{t.cols}" for t in self.tensors)
        return (
            f"ExpertView(layer {self.layer_id}, expert {self.expert_id}: {shapes}, "
            f"Q{self.tensors[0].bits})"
        )


def _id(value: object) -> int | None:
    """``value`` as a layer or expert id (any integer, numpy's too), else None."""
    return operator.index(value) if isinstance(value, SupportsIndex) else None


def _shown(part: object) -> str:
    """One index as it is written between brackets: ``0``, ``'x'``, ``:``, ``1:3``."""
    if not isinstance(part, slice):
        return repr(part)
    text = ":".join("" if x is None else repr(x) for x in (part.start, part.stop))
    return text if part.step is None else f"{text}:{part.step!r}"


def _bad_key(key: object) -> TypeError:
    """What a key that is not a (layer, expert) pair of integers gets: the forms a vault
    takes, the key as written, and for the likely mistakes what to write instead."""
    parts = key if isinstance(key, tuple) else (key,)
    shown = ", ".join(_shown(p) for p in parts) if parts else "()"
    if isinstance(key, tuple) and len(parts) == 1:
        shown += ","
    if isinstance(key, str):
        hint = f": a tensor by its HF name is vault.get_tensor({key!r})"
    elif any(isinstance(p, slice) for p in parts):
        hint = ": slices are not supported (vault.keys() lists the (layer, expert) pairs it holds)"
    elif not isinstance(key, tuple) and (layer := _id(key)) is not None:
        hint = f": the experts of layer {layer} are [k for k in vault if k[0] == {layer}]"
    elif len(parts) == 2:
        wrong = next(p for p in parts if _id(p) is None)
        hint = f": layer and expert are integers, not {type(wrong).__name__}"
    else:
        hint = f": two ids, not {len(parts)}"
    return TypeError(
        f"a vault is indexed by (layer, expert), e.g. vault[0, 1]; got vault[{shown}]{hint}"
    )


class Vault(Mapping[tuple[int, int], ExpertView]):
    """A read-only vault: header, arch, table and descriptors in memory, blobs on demand.

    A :class:`~collections.abc.Mapping` of ``(layer, expert)`` to :class:`ExpertView`:
    ``len``, iteration, ``in``, :meth:`keys`, :meth:`values`, :meth:`items` and :meth:`get`
    go in table order, reading an expert only when it is reached. :meth:`keys` is a list and
    :meth:`items` an iterator (as before the vault was a Mapping); two vaults are equal only
    if they are the same object (comparing contents would read every expert).

    ``header`` and ``arch`` are dicts of plain values; ``header_record`` and
    ``arch_record`` the numpy records they are read from. :meth:`tensor_names` and
    :meth:`get_tensor` name the weights as ``smoe export --hf`` does.

    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     print(v)
    ...     print(len(v), (1, 2) in v, v.layers())
    ...     e = v[1, 2]
    Vault('fixtures/q4_v2.smoe', v2, Q4, 8 experts in 2 layers)
    8 True {0: 4, 1: 4}
    >>> v[1, 9]
    Traceback (most recent call last):
    KeyError: 'fixtures/q4_v2.smoe: no expert (layer 1, expert 9)'
    >>> v[0, :]
    Traceback (most recent call last):
    TypeError: a vault is indexed by (layer, expert), e.g. vault[0, 1]; got vault[0, :]: \
slices are not supported (vault.keys() lists the (layer, expert) pairs it holds)
    """

    def __new__(cls, *args: object, **kwargs: object) -> Vault:
        """``Vault(path)`` alone says how a vault is opened (the constructor takes the
        parts :meth:`open` has read and checked).

        >>> Vault("model.smoe")
        Traceback (most recent call last):
        TypeError: Vault('model.smoe'): open a vault file with Vault.open('model.smoe') \
(Vault.from_array for one in memory)
        """
        if len(args) + len(kwargs) == 1:
            (given,) = (*args, *kwargs.values())
            raise TypeError(
                f"Vault({given!r}): open a vault file with Vault.open({given!r}) "
                "(Vault.from_array for one in memory)"
            )
        return super().__new__(cls)

    def __init__(
        self,
        path: Path,
        data: Data,
        geo: Geometry,
        report: Report,
        header: np.void,
        table: np.ndarray,
        descriptors: np.ndarray,
    ) -> None:
        self.path = path
        self.data = data  # FileView (or an array): data[a:b] reads, len(data) = file size
        self.geometry = geo
        self.report = report  # findings of the checks run at open (warnings, info)
        self.header_record = header
        self.arch_record: np.void | None = (
            arch_view(data, geo) if geo.version >= layout.VERSION_WITH_ARCH else None
        )
        self.table, self.descriptors = table, descriptors
        self._checked: set[int] = set()
        self._keys = (self.table["layer_id"].astype(np.uint64) << np.uint64(32)) | self.table[
            "expert_id"
        ].astype(np.uint64)
        self._hf: dict[str, OutTensor] | None = None  # export's names, worked out on first use
        self._sidecar: tuple[dict[str, Any] | None, Path] | None = None  # manifest, on first use

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Vault:
        """Open and check a vault file; ``fileio.NotRegular`` for FIFOs, folders, devices.

        A file that cannot be opened raises the ``OSError`` ``open()`` would (also a
        ``NotRegular``): ``FileNotFoundError`` when it is missing, ``PermissionError``,
        ``IsADirectoryError``. A file that is not a vault raises :class:`VaultError`. Use it
        in a ``with`` block or call :meth:`close`.

        >>> v = Vault.open("fixtures/q4_v2.smoe")
        >>> v.geometry.version, v.bits
        (2, 4)
        >>> v.close()
        """
        view = FileView.open(path)
        try:
            return cls.from_array(view, view.path)
        except BaseException:
            view.close()
            raise

    @classmethod
    def from_array(cls, data: Data, path: Path | str = "<memory>") -> Vault:
        """A vault over an opened :class:`FileView` or an in-memory uint8 array.

        >>> import numpy as np
        >>> v = Vault.from_array(np.fromfile("fixtures/q4_v2.smoe", np.uint8))
        >>> str(v.path), len(v)
        ('<memory>', 8)
        """
        path = Path(path)
        report = Report(size=len(data))
        if len(data) < layout.HEADER_SIZE:
            raise VaultError(
                path,
                Finding.of(
                    Rule.HEADER_SIZE,
                    0,
                    "header",
                    f"file of {len(data)} bytes is shorter than the 64-byte header",
                    layout.HEADER_SIZE,
                    len(data),
                ),
            )
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
        """Close the file (a closed vault's lookups still work; expert reads do not).

        >>> v = Vault.open("fixtures/q4_v2.smoe")
        >>> v.close()
        >>> v.closed, len(v), (0, 1) in v
        (True, 8, True)
        >>> v[0, 1]
        Traceback (most recent call last):
        smoe.errors.SmoeError: fixtures/q4_v2.smoe: cannot read ... the file is closed
        """
        if isinstance(self.data, FileView):
            self.data.close()

    @property
    def closed(self) -> bool:
        """True once the file is closed (a vault over an array has nothing to close).

        >>> with Vault.open("fixtures/q4_v2.smoe") as v:
        ...     v.closed
        False
        >>> v.closed
        True
        """
        return isinstance(self.data, FileView) and self.data.closed

    def __enter__(self) -> Vault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Vault({str(self.path)!r}, v{self.geometry.version}, Q{self.bits}, "
            f"{len(self)} experts in {len(self.layers())} layers)"
        )

    # ---- lookup ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.table)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return object.__hash__(self)

    @property
    def header(self) -> Fields:
        """The header's fields as a new dict of ints (``magic`` as hex text, as ``dump --json``
        prints it; ``bytes(h["magic"])`` gives the bytes).

        >>> h = Vault.open("fixtures/q4_v2.smoe").header
        >>> h["version"], h["total_experts"], h["d_model"], h["data_offset"]
        (2, 8, 64, 16384)
        """
        return Fields(self.header_record)

    @property
    def arch(self) -> Fields | None:
        """The arch block's fields as a new dict (None in a v1 vault): ints, floats as
        the shortest decimal of their float32, ``model_type`` a str.

        >>> a = Vault.open("fixtures/q4_v2.smoe").arch
        >>> a["model_type"], a["num_heads"], a["moe_top_k"], a["rms_norm_eps"]
        ('olmoe', 4, 2, 1e-05)
        >>> Vault.open("fixtures/q4_v1.smoe").arch is None
        True
        """
        return None if self.arch_record is None else Fields(self.arch_record)

    @property
    def bits(self) -> int:
        """Bits per weight code: 2 or 4.

        >>> Vault.open("fixtures/q2_v2.smoe").bits
        2
        """
        return int(self.header_record["bits"])

    def index(self, layer: SupportsIndex, expert: SupportsIndex) -> int:
        """Table index of (layer, expert); KeyError if the vault does not hold it.

        >>> v = Vault.open("fixtures/q4_v2.smoe")
        >>> v.index(0, 0), v.index(1, 3)
        (0, 7)
        """
        try:
            layer, expert = operator.index(layer), operator.index(expert)
        except TypeError:
            raise _bad_key((layer, expert)) from None
        if 0 <= layer < _ID_LIMIT and 0 <= expert < _ID_LIMIT:
            key = np.uint64((layer << 32) | expert)
            i = int(np.searchsorted(self._keys, key))
            if i < len(self._keys) and self._keys[i] == key:
                return i
        raise KeyError(f"{self.path}: no expert (layer {layer}, expert {expert})")

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        try:
            self.index(*key)
        except (KeyError, TypeError):
            return False
        return True

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """(layer, expert) of every entry, in table order."""
        return iter(self.keys())

    def keys(self) -> list[tuple[int, int]]:  # type: ignore[override]  # a list, as before
        """(layer, expert) of every entry, in table order.

        >>> Vault.open("fixtures/q4_v2.smoe").keys()[:3]
        [(0, 0), (0, 1), (0, 2)]
        """
        return [(int(k >> np.uint64(32)), int(k & np.uint64(0xFFFFFFFF))) for k in self._keys]

    def values(self) -> ValuesView[ExpertView]:
        """Every expert in table order, each read when reached (as the Mapping's view).

        >>> with Vault.open("fixtures/q4_v2.smoe") as v:
        ...     [e.expert_id for e in v.values()][:5]
        [0, 1, 2, 3, 0]
        """
        return ValuesView(self)

    def items(self) -> Iterator[tuple[tuple[int, int], ExpertView]]:  # type: ignore[override]
        """((layer, expert), expert view) pairs in table order, each expert read when reached
        (an iterator, as before the vault was a Mapping).

        >>> with Vault.open("fixtures/q4_v2.smoe") as v:
        ...     for (layer, expert), e in v.items():
        ...         if layer == 1 and expert < 2:
        ...             print(layer, expert, e["down_proj"].shape)
        1 0 (64, 32)
        1 1 (64, 32)
        """
        for key in self.keys():
            yield key, self.expert(*key)

    @overload
    def get(self, key: object, /) -> ExpertView | None: ...
    @overload
    def get(self, key: object, default: _T, /) -> ExpertView | _T: ...
    def get(self, key: object, default: Any = None, /) -> Any:
        """``vault[key]`` if the vault holds ``key`` (as ``in`` says), else ``default``.

        >>> v = Vault.open("fixtures/q4_v2.smoe")
        >>> v.get((0, 1)), v.get((0, 9)), v.get("x", "none")
        (ExpertView(layer 0, expert 1: ...), None, 'none')
        """
        if key not in self:  # a key of another form too: as for a dict, not an error
            return default
        return self[key]  # type: ignore[index]

    def layers(self) -> dict[int, int]:
        """layer_id -> number of experts stored.

        >>> Vault.open("fixtures/partial_groups.smoe").layers()
        {0: 3, 1: 5}
        """
        ids, counts = np.unique(self.table["layer_id"], return_counts=True)
        return {int(i): int(c) for i, c in zip(ids, counts)}

    def __getitem__(self, key: tuple[SupportsIndex, SupportsIndex]) -> ExpertView:
        """``vault[layer, expert]``: the same as :meth:`expert`; any other key is a
        TypeError naming the forms a vault takes."""
        if not isinstance(key, tuple) or len(key) != 2 or any(_id(k) is None for k in key):
            raise _bad_key(key)
        return self.expert(*key)

    # ---- the manifest beside the vault: metadata and provenance ------------------------------
    def _manifest(self) -> tuple[dict[str, Any] | None, Path]:
        """The manifest beside the vault and its path, read (bounded by the table's size) and
        checked to describe the vault, once; None when there is none (or the vault is an
        array)."""
        if self._sidecar is None:
            beside = isinstance(self.data, FileView)
            self._sidecar = names.load_manifest(self) if beside else (None, Path())
        return self._sidecar

    @property
    def metadata(self) -> dict[str, str]:
        """The manifest's free-form ``metadata`` (``name``, ``description``, ``license``,
        ``smoe meta``'s keys) as a new dict of text; ``{}`` when there is none or no
        manifest. As safetensors' ``safe_open().metadata()``; a manifest of another vault is
        refused, as ``export --hf`` refuses it.

        >>> Vault.open("fixtures/q4_v2.smoe").metadata
        {}
        """
        doc, where = self._manifest()
        return {} if doc is None else stored_metadata(doc, where)

    @property
    def provenance(self) -> dict[str, Any] | None:
        """Where the weights came from and what made the vault: the manifest's ``source``
        (model type, shards and their hashes, the model id and revision, the card, the
        importance matrix or calibration data) and ``tool`` (command, version, options), as
        new dicts of JSON values; None when there is no manifest (docs/MANIFEST.md).

        >>> p = Vault.open("fixtures/q4_v2.smoe").provenance
        >>> p["source"]["model_type"], p["tool"]["options"]["bits"]
        ('olmoe', 4)
        """
        doc = self._manifest()[0]
        if doc is None:
            return None
        return copy.deepcopy({"source": doc.get("source"), "tool": doc.get("tool")})

    # ---- the names export --hf writes ------------------------------------------------------
    def _hf_layout(self) -> dict[str, OutTensor]:
        """Export's expert tensors by name, in natural order; worked out once,
        from the manifest and scout beside the vault (a vault over an array has neither)."""
        if self._hf is None:
            beside = isinstance(self.data, FileView)
            doc, manifest_path = self._manifest()
            scout = companions(self.path)[0]

            def scout_names() -> set[str]:
                return set(read_header(scout)) if beside and os.path.lexists(scout) else set()

            found = names.expert_layout(self, doc, manifest_path, scout_names)
            self._hf = {n: found[n] for n in sorted(found, key=names.natural_key)}
        return self._hf

    def tensor_names(self) -> list[str]:
        """The expert tensors' names as ``smoe export --hf`` writes them (safetensors'
        ``keys()``), in natural order (layer 2 before layer 10, as export fills its shards):
        the source's, from the manifest beside the vault, else the family's standard names
        (Mixtral's by the arch block or the scout's routers); a manifest that describes
        another vault is refused as export refuses it.

        >>> names = Vault.open("fixtures/q4_v2.smoe").tensor_names()
        >>> len(names), names[:2]  # doctest: +NORMALIZE_WHITESPACE
        (24, ['model.layers.0.mlp.experts.0.down_proj.weight',
              'model.layers.0.mlp.experts.0.gate_proj.weight'])
        """
        return list(self._hf_layout())

    def get_tensor(self, name: str) -> np.ndarray:
        """The tensor ``name`` of :meth:`tensor_names` dequantised to a new float32 array,
        in the shape and layout export writes it (a fused tensor whole: every expert's
        slab); an unknown name is a KeyError naming the nearest ones.

        >>> v = Vault.open("fixtures/q4_v2.smoe")
        >>> w = v.get_tensor("model.layers.1.mlp.experts.2.down_proj.weight")
        >>> w.shape, w.dtype, bool((w == v[1, 2]["down_proj"].dequantize()).all())
        ((64, 32), dtype('float32'), True)
        >>> v.get_tensor("model.layers.1.mlp.experts.2.down.weight")
        Traceback (most recent call last):
        KeyError: "fixtures/q4_v2.smoe: no tensor 'model.layers.1.mlp.experts.2.down.weight'; \
nearest: 'model.layers.1.mlp.experts.2.down_proj.weight', ... (vault.tensor_names() lists all 24)"
        """
        found = self._hf_layout()
        if not isinstance(name, str):
            raise TypeError(
                f"a tensor name is a str, e.g. {next(iter(found), 'x')!r}; got {name!r}"
            )
        out = found.get(name)
        if out is None:
            near = difflib.get_close_matches(name, list(found), n=3)
            shown = f"; nearest: {', '.join(map(repr, near))}" if near else ""
            raise KeyError(
                f"{self.path}: no tensor {name!r}{shown} (vault.tensor_names() lists all "
                f"{len(found)})"
            )
        return names.assemble(self, out)

    def expert(self, layer: SupportsIndex, expert: SupportsIndex) -> ExpertView:
        """One expert's tensors, read with one ``pread``; its descriptors are checked first.

        >>> with Vault.open("fixtures/q4_v2.smoe") as v:
        ...     e = v.expert(0, 3)
        >>> e.layer_id, e.expert_id, e.keys()
        (0, 3, ('gate_proj', 'up_proj', 'down_proj'))
        """
        i = self.index(layer, expert)
        if i not in self._checked:
            report = Report(size=len(self.data))
            check_descriptors(
                self.table,
                self.descriptors,
                self.geometry,
                report,
                self.header_record,
                self.arch_record,
                i,
                i + 1,
            )
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

        def tensor(t: int) -> TensorView:
            p0, s0 = int(starts[t]) - lo, int(starts[3 + t]) - lo
            return TensorView(
                TENSOR_NAMES[t],
                int(d[t]["rows"]),
                int(d[t]["cols"]),
                self.bits,
                blob[p0 : p0 + int(d[t]["packed_size"])],
                blob[s0 : s0 + int(d[t]["scales_size"])].view("<f2"),
            )

        return ExpertView(
            int(e["layer_id"]), int(e["expert_id"]), i, (tensor(0), tensor(1), tensor(2))
        )
