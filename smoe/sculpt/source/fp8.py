"""FP8 expert weights with their scales: found beside a weight, dequantised on read.

A weight stored as FP8 is read with the scale tensor its checkpoint ships beside it and
dequantised to BF16 patterns before the encoder sees it, one matrix at a time
(:mod:`smoe.interop.fp8` does the arithmetic: its :func:`~smoe.interop.fp8.scheme_of`
says which scales a weight takes, or refuses it naming its format). Any other scaled or
packed format is refused naming it.

Scales are read when a matrix is dequantised, and only the ones it needs (a stacked scale
tensor's slab of one expert): nothing is cached, so memory is bounded by one matrix and
its scales whatever the number of experts, and reads from several threads share nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from smoe.errors import RefusedInput
from smoe.interop.fp8 import Scheme, dequantize_bf16, scale_f32, scheme_of
from smoe.interop.safetensors_io import DTYPE_SIZES, TensorInfo, read_array
from smoe.plumbing import fileio

__all__ = ["Fp8Scale", "read_raw", "scale_of"]


@dataclass(frozen=True)
class Fp8Scale:
    """The scales of one FP8 weight: the ``weight`` (the whole tensor, 2-D or a stack of
    experts), its ``scale`` tensor and the ``scheme`` (:class:`~smoe.interop.fp8.Scheme`:
    FP8 dtype, block, whether the scales are stacked per expert).

    >>> from pathlib import Path
    >>> from smoe.interop.fp8 import Scheme
    >>> w = TensorInfo("e.weight", Path("m.safetensors"), "F8_E4M3", (200, 300), 8, 60000)
    >>> s = TensorInfo("e.weight_scale_inv", Path("m.safetensors"), "F32", (2, 3), 60008, 24)
    >>> Fp8Scale(w, s, Scheme("fp8-block", "F8_E4M3", s.name, (128, 128))).block
    (128, 128)
    """

    weight: TensorInfo
    scale: TensorInfo
    scheme: Scheme

    def record(self) -> dict:
        """What the manifest says of these scales (``experts[].tensors[].fp8``): the FP8
        dtype, the scale tensor and its dtype, the scheme and the block one scale covers.

        >>> from pathlib import Path
        >>> from smoe.interop.fp8 import Scheme
        >>> w = TensorInfo("e.weight", Path("m.safetensors"), "F8_E4M3", (200, 300), 8, 60000)
        >>> s = TensorInfo("e.weight_scale_inv", Path("m.safetensors"), "F32", (2, 3), 60008, 24)
        >>> r = Fp8Scale(w, s, Scheme("fp8-block", "F8_E4M3", s.name, (128, 128))).record()
        >>> r["dtype"], r["scale"], r["kind"], r["block"]
        ('F8_E4M3', 'e.weight_scale_inv', 'fp8-block', [128, 128])
        """
        return {
            "dtype": self.scheme.dtype,
            "scale": self.scale.name,
            "scale_dtype": self.scale.dtype,
            "kind": self.scheme.kind,
            "block": list(self.block),
        }

    def applied_bytes(self, rows: slice | None = None, transposed: bool = False) -> int:
        """Bytes of the scales applied to one matrix of the weight: a 2-D weight or one
        slab, whole, or just its rows ``rows`` (a fused gate or up half; of a transposed
        layout, its columns ``rows``); a block straddling the half's edge counts in full.

        >>> from pathlib import Path
        >>> from smoe.interop.fp8 import Scheme
        >>> w = TensorInfo("e.weight", Path("m.safetensors"), "F8_E4M3", (4, 200, 300), 8, 0)
        >>> s = TensorInfo("e.weight_scale_inv", Path("m.safetensors"), "F32", (4, 2, 3), 0, 96)
        >>> scale = Fp8Scale(w, s, Scheme("fp8-block", "F8_E4M3", s.name, (128, 128), True))
        >>> scale.applied_bytes(), scale.applied_bytes(slice(100, 200))  # 6 scales, or 2 x 3
        (24, 24)
        >>> scale.applied_bytes(slice(0, 100)), scale.applied_bytes(slice(0, 100), True)
        (12, 8)
        """
        n_rows, n_cols = self.weight.shape[-2], self.weight.shape[-1]
        br, bc = self.block
        lo, hi = (0, n_cols if transposed else n_rows) if rows is None else (rows.start, rows.stop)
        span = -(-hi // (bc if transposed else br)) - lo // (bc if transposed else br)
        other = -(-n_rows // br) if transposed else -(-n_cols // bc)
        return span * other * DTYPE_SIZES[self.scale.dtype]

    @property
    def block(self) -> tuple[int, int]:
        """The ``(rows, columns)`` of weights one scale covers.

        >>> from pathlib import Path
        >>> from smoe.interop.fp8 import Scheme
        >>> w = TensorInfo("c.weight", Path("m.safetensors"), "F8_E4M3", (4, 6), 8, 24)
        >>> s = TensorInfo("c.weight_scale", Path("m.safetensors"), "F32", (4, 1), 32, 16)
        >>> Fp8Scale(w, s, Scheme("fp8-channel", "F8_E4M3", s.name, (1, 6))).block
        (1, 6)
        """
        block = self.scheme.block
        if block is None:  # a Scheme of kind "none" is never an Fp8Scale (see scale_of)
            raise ValueError(f"{self.weight.name}: scheme {self.scheme.kind!r} has no block")
        return block

    def dequantize(
        self, raw: np.ndarray, index: int | None, where: str, rows: slice | None = None
    ) -> np.ndarray:
        """BF16 patterns (uint16, fresh) of ``raw``: the FP8 bytes as uint8 of the 2-D weight
        (``index`` None), or of slab ``index`` of a stacked weight, whole or just its rows
        ``rows`` (a fused gate or up half; None: all of the slab's rows).

        A block may straddle the start of ``rows``: each weight still takes the scale of its
        block in the slab. Refusals (a non-finite result) start with ``where``, followed for
        a slab by ``[index]`` or by ``[index, start:stop]``, the slab rows dequantised at
        once, from whose ``start`` a row number in the message counts.

        >>> import tempfile
        >>> from pathlib import Path
        >>> from smoe.interop.safetensors_io import read_header, write_file
        >>> from smoe.plumbing import fileio
        >>> shard = Path(tempfile.mkdtemp()) / "model.safetensors"
        >>> raw = np.full((3, 4), 0x38, np.uint8)  # F8_E4M3 1.0 everywhere
        >>> data = {"e.weight": raw, "e.weight_scale_inv": np.float32([[0.5, 2], [4, 8]])}
        >>> items = [("e.weight", "F8_E4M3", (3, 4)), ("e.weight_scale_inv", "F32", (2, 2))]
        >>> def fill(fd: int, i: int, at: int) -> None:
        ...     fileio.pwrite_all(fd, data[items[i][0]], at, shard)
        >>> size = write_file(shard, items, fill)
        >>> scale = scale_of(read_header(shard)["e.weight"], read_header(shard), (2, 2))
        >>> [[hex(v) for v in row] for row in scale.dequantize(raw, None, "e")]
        [['0x3f00', '0x3f00', '0x4000', '0x4000'], ['0x3f00', '0x3f00', '0x4000', '0x4000'], \
['0x4080', '0x4080', '0x4100', '0x4100']]
        >>> raw[2, 3] = 0x7F  # NaN
        >>> scale.dequantize(raw, None, "e")
        Traceback (most recent call last):
        smoe.errors.RefusedInput: e: weight at row 2 col 3 is not finite once dequantised \
(F8_E4M3 code 0x7f = nan, times scale 8.0 = nan); refused: FP8 weights must dequantise to \
finite values
        """
        shape = self.weight.shape
        if (len(shape), index is None) not in ((2, True), (3, False)):
            raise ValueError(f"{self.weight.name} {list(shape)}: index {index} does not fit")
        if index is not None and not 0 <= index < shape[0]:
            raise ValueError(f"{self.weight.name} {list(shape)}: no slab {index}")
        n_rows, n_cols = shape[-2], shape[-1]
        r0, r1 = (0, n_rows) if rows is None else (rows.start, rows.stop)
        if rows is not None and not (0 <= r0 < r1 <= n_rows and rows.step in (None, 1)):
            raise ValueError(f"{self.weight.name}: rows {rows} outside 0..{n_rows}")
        if raw.dtype != np.uint8 or raw.shape != (r1 - r0, n_cols):
            if rows is None and raw.ndim == 2 and raw.shape[1] == n_cols:
                raise RefusedInput(
                    f"{where}: {raw.shape[0]} of the {n_rows} rows of slab {index} of a "
                    "stacked FP8 weight, without their row offset; refused: the scales of "
                    "a row slice cannot be matched to its weights"
                )
            raise ValueError(
                f"{self.weight.name}: raw must be uint8 {[r1 - r0, n_cols]}, got "
                f"{raw.dtype} {list(raw.shape)}"
            )
        scale = self._read(index)
        if r0 == 0 and r1 == n_rows:
            at = where if index is None else f"{where}[{index}]"
            return dequantize_bf16(raw, self.scheme.dtype, scale, self.block, where=at)
        sc = scale.reshape(-1, 1) if scale.ndim < 2 else scale
        br, bc = self.block
        out = np.empty((r1 - r0, n_cols), np.uint16)
        a = r0
        while a < r1:  # a straddling first block alone, then whole blocks from a boundary
            b = min(r1, (a // br + 1) * br) if a % br else r1
            dequantize_bf16(
                raw[a - r0 : b - r0],
                self.scheme.dtype,
                sc[a // br : -(-b // br)],
                (br, bc),
                out[a - r0 : b - r0],
                where=f"{where}[{a}:{b}]" if index is None else f"{where}[{index}, {a}:{b}]",
            )
            a = b
        return out

    def _read(self, index: int | None) -> np.ndarray:
        """The float32 scales of the weight's matrix ``index`` (of the 2-D weight: None):
        for stacked scales, a positioned read of just that slab."""
        info = self.scale
        if index is None or not self.scheme.stacked:
            return scale_f32(read_array(info), info.dtype)
        slab = info.shape[1:]
        size = int(np.prod(slab, dtype=np.int64)) * DTYPE_SIZES[info.dtype]
        part = TensorInfo(
            f"{info.name}[{index}]", info.path, info.dtype, slab, info.offset + index * size, size
        )
        return scale_f32(read_array(part), info.dtype)


def read_raw(info: TensorInfo) -> np.ndarray:
    """A tensor's bytes as a uint8 array of its shape (one byte per FP8 value).

    >>> from pathlib import Path
    >>> from smoe.interop.safetensors_io import read_header
    >>> norm = read_header(Path("fixtures/checkpoints/qwen3_moe/model.safetensors"))[
    ...     "model.norm.weight"]
    >>> read_raw(norm).dtype, read_raw(norm).shape  # 64 BF16 values: not of its shape
    (dtype('uint8'), (128,))
    """
    buf = np.empty(info.nbytes, np.uint8)
    fd = fileio.open_input(info.path)
    try:
        fileio.preadv_exact(fd, buf, info.offset, info.path)
    finally:
        os.close(fd)
    return buf.reshape(info.shape) if len(info.shape) and buf.size == np.prod(info.shape) else buf


def scale_of(
    info: TensorInfo,
    tensors: dict[str, TensorInfo],
    declared: tuple[int, int] | None = None,
) -> Fp8Scale | None:
    """The scales an expert weight needs (None for a float weight without any), by
    :func:`~smoe.interop.fp8.scheme_of`: a float weight with a scale companion, FP8
    without its scales, or another quantised format is refused naming it. ``declared``:
    the block size config.json declares (:func:`~smoe.interop.fp8.declared_block`); the
    scales must fit it exactly.

    >>> from pathlib import Path
    >>> from smoe.interop.safetensors_io import read_header
    >>> ck = read_header(Path("fixtures/checkpoints/qwen3_moe/model.safetensors"))
    >>> scale_of(ck["model.layers.0.mlp.experts.0.gate_proj.weight"], ck) is None
    True
    >>> w = TensorInfo("e.weight", Path("m.safetensors"), "F8_E4M3", (200, 300), 8, 60000)
    >>> s = TensorInfo("e.weight_scale_inv", Path("m.safetensors"), "F32", (2, 3), 60008, 24)
    >>> scale_of(w, {w.name: w, s.name: s}).scheme
    Scheme(kind='fp8-block', dtype='F8_E4M3', scale='e.weight_scale_inv', block=(128, 128), \
stacked=False)
    >>> scale_of(w, {w.name: w, s.name: s}, (64, 128))
    Traceback (most recent call last):
    smoe.errors.RefusedInput: m.safetensors: tensor 'e.weight' (scales 'e.weight_scale_inv'): \
scale shape [2, 3] does not fit weight shape [200, 300] in the declared blocks [64, 128] \
(quantization_config.weight_block_size), which need [4, 3]; refused: the scales would be \
applied to the wrong weights
    >>> scale_of(w, {w.name: w})
    Traceback (most recent call last):
    smoe.errors.RefusedInput: m.safetensors: tensor 'e.weight' is F8_E4M3 without scales \
(neither 'e.weight_scale_inv' nor 'e.weight_scale' is in the checkpoint); refused: FP8 \
weights are read only with their scales
    """
    scheme = scheme_of(info.name, tensors, declared, where=str(info.path))
    if scheme.kind == "none" or scheme.scale is None:
        return None
    return Fp8Scale(info, tensors[scheme.scale], scheme)
