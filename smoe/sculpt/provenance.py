"""What the manifest records of a sculpt: the tool and its source (no time stamps, no
absolute paths), and each expert tensor's provenance (docs/MANIFEST.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smoe.errors import SmoeError
from smoe.format.manifest import tool_info
from smoe.sculpt.options import SculptOptions, finite
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["provenance", "tensor_entries"]


def provenance(
    ckpt: Checkpoint,
    opts: SculptOptions,
    imatrix: dict[str, Any] | None = None,
    calibration: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's ``tool`` and ``source``: no time stamps, no absolute paths
    (``imatrix``: the importance matrix's record, kept in ``source`` by file name;
    ``calibration``: the calibration data's record, likewise).

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe_sharded")
    >>> tool, source = provenance(ck, SculptOptions(bits=2))
    >>> tool["options"]["bits"], source["model_type"], source["files"][0]["name"]
    (2, 'qwen3_moe', 'model-00001-of-00003.safetensors')
    """
    tool = tool_info(
        "sculpt",
        {
            "bits": opts.bits,
            "version": opts.version,
            "scale": opts.scale,
            "max_layers": opts.max_layers,
            "max_experts": opts.max_experts,
        },
    )
    files = []
    for shard in sorted({t.path for t in ckpt.tensors.values()}):
        try:
            size = shard.stat().st_size
        except OSError as e:  # exit status 1, as every failed read of a shard's size
            raise SmoeError(f"{shard}: cannot read: {e.strerror or e}") from None
        files.append({"name": text_of(shard.relative_to(ckpt.root).as_posix()), "size": size})
    source: dict[str, Any] = {"model_type": ckpt.model_type, "files": files}
    family = ckpt.family_record()
    if family is not None:
        source["family"] = family
    if imatrix is not None:
        record = dict(imatrix)
        record["name"] = text_of(Path(record.pop("path")).name)
        source["imatrix"] = record
    if calibration is not None:
        source["calibration"] = dict(calibration)
    return tool, source


def text_of(name: str) -> str:
    """A file name as the manifest's UTF-8 text: bytes that are not UTF-8 (which Python keeps
    as lone surrogates, which no strict JSON reader accepts) written as ``\\xNN``.

    >>> text_of(os.fsdecode(b"model-caf\\xe9.safetensors"))
    'model-caf\\\\xe9.safetensors'
    """
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def tensor_entries(
    ref: ExpertRef,
    src_crcs: Sequence[int],
    snrs: Sequence[float | None],
    weighted: Sequence[float | None] | None = None,
) -> list[dict[str, Any]]:
    """Per tensor provenance of one expert for the manifest (docs/MANIFEST.md); with
    ``weighted`` (a run with an importance matrix) also ``weighted_snr_db``.

    >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe_fused").experts[(0, 1)]
    >>> gate = tensor_entries(ref, [7, 8, 9], [12.5, 12.0, None], [13.123456, None, None])[0]
    >>> gate["source"], gate["index"], gate["rows"], gate["weighted_snr_db"]
    ('model.layers.0.mlp.experts.gate_up_proj', 1, [0, 48], 13.1235)
    """
    out: list[dict[str, Any]] = [
        {
            "name": name,
            "source": info.name,
            "index": idx,
            "rows": None if rows is None else [rows.start, rows.stop],
            "source_crc32c": crc,
            "snr_db": snr,
        }
        for name, (info, idx, rows), crc, snr in zip(TENSOR_NAMES, ref.sources, src_crcs, snrs)
    ]
    for entry, scale in zip(out, ref.scales):  # FP8: read with these scales, as BF16
        if scale is not None:
            entry["fp8"] = scale.record()
    if ref.transposed:  # the source slab holds the transposes: [E, H, 2I], [E, I, H]
        for entry in out:
            entry["transposed"] = True
    if weighted is not None:
        for entry, value in zip(out, weighted):
            entry["weighted_snr_db"] = None if not finite(value) else round(float(value), 4)
    return out
