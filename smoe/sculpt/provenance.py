"""What the manifest records of a sculpt: the tool and its source (no time stamps, no
absolute paths), each expert tensor's provenance, and the metadata given (docs/MANIFEST.md).

The source's files are identified without reading the weights a second time: each shard by
the SHA-256 of its safetensors header (the 8-byte length and the JSON that names every
tensor's dtype, shape and byte range), the small files the sculpt reads whole (config.json,
the index, the model card) by the SHA-256 of all their bytes, and every expert tensor by the
CRC-32C of its source bytes (``experts[].tensors[].source_crc32c``, computed while they are
read anyway). A whole shard's SHA-256 would be a second full read of the checkpoint (the
sculpt reads its tensors in worker processes, out of file order): for a model in the
HuggingFace cache the Hub's own SHA-256 of each shard is recorded instead, from the cache's
layout (:func:`~smoe.sculpt.source.hub.lfs_sha256`).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smoe.errors import SmoeError
from smoe.format.manifest import tool_info
from smoe.plumbing import fileio
from smoe.plumbing.text import utf8_text
from smoe.sculpt.options import SculptOptions, finite
from smoe.sculpt.outcome import TensorOutcome
from smoe.sculpt.source.card import CARD, read_card
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe.sculpt.source.hub import cache_origin, lfs_sha256
from smoe.vault.meta import check_metadata
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["header_sha256", "metadata_of", "provenance", "small_files", "tensor_entries"]

SMALL_FILE_BYTES = 64 << 20
"""A small file larger than this is listed without its SHA-256 (null): a model card that is
gigabytes long is not read whole."""
_CHUNK = 1 << 20


def provenance(
    ckpt: Checkpoint,
    opts: SculptOptions,
    imatrix: dict[str, Any] | None = None,
    calibration: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's ``tool`` and ``source``: no time stamps, no absolute paths
    (``imatrix``: the importance matrix's record, kept in ``source`` by file name;
    ``calibration``: the calibration data's record, likewise). ``source`` also holds, for a
    snapshot of the HuggingFace cache (a model id), ``model_id`` and ``revision`` (its
    commit), and the model card's front matter (``card``) when there is one; a card that
    cannot be read adds a warning to ``ckpt.warnings``.

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe_sharded")
    >>> tool, source = provenance(ck, SculptOptions(bits=2))
    >>> tool["options"]["bits"], source["model_type"], source["files"][0]["name"]
    (2, 'qwen3_moe', 'model-00001-of-00003.safetensors')
    >>> [f["name"] for f in source["small_files"]], "model_id" in source
    (['config.json', 'model.safetensors.index.json'], False)
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
    origin = cache_origin(ckpt.root)
    for shard in sorted({t.path for t in ckpt.tensors.values()}):
        try:
            size = shard.stat().st_size
        except OSError as e:  # exit status 1, as every failed read of a shard's size
            raise SmoeError(f"{shard}: cannot read: {e.strerror or e}") from None
        entry = {
            "name": text_of(shard.relative_to(ckpt.root).as_posix()),
            "size": size,
            "header_sha256": header_sha256(shard),
        }
        hub_sha = lfs_sha256(shard) if origin is not None else None
        if hub_sha is not None:
            entry["lfs_sha256"] = hub_sha
        files.append(entry)
    source: dict[str, Any] = {"model_type": ckpt.model_type, "files": files}
    if origin is not None:
        source["model_id"], source["revision"] = origin
    source["small_files"] = small_files(ckpt)
    card, warning = read_card(ckpt.root)
    if card is not None:
        source["card"] = card
    if warning is not None and warning not in ckpt.warnings:
        ckpt.warnings.append(warning)
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


def metadata_of(opts: SculptOptions) -> dict[str, str]:
    """The manifest's ``metadata`` from ``--title``, ``--description`` and ``--license``
    (checked: :func:`smoe.vault.meta.check_value`; a UsageError before anything is written).

    >>> metadata_of(SculptOptions(title="Qwen3 MoE, Q4", license="apache-2.0"))
    {'license': 'apache-2.0', 'name': 'Qwen3 MoE, Q4'}
    >>> metadata_of(SculptOptions())
    {}
    """
    given = {"name": opts.title, "description": opts.description, "license": opts.license}
    return check_metadata({k: v for k, v in given.items() if v is not None})


def header_sha256(shard: Path) -> str:
    """SHA-256 of a safetensors shard's header: its 8-byte length and the JSON after it (the
    names, dtypes, shapes and byte ranges of its tensors), read again (the checkpoint checked
    it when it was opened).

    >>> header_sha256(Path("fixtures/checkpoints/qwen3_moe/model.safetensors"))[:16]
    '2935a591d028c478'
    """
    fd = fileio.open_input(shard)
    try:
        head = fileio.pread_exact(fd, 8, 0, shard)
        (n,) = struct.unpack("<Q", head)
        size = os.fstat(fd).st_size
        if n > size - 8:
            raise SmoeError(f"{shard}: header length {n} exceeds the file size {size}")
        return hashlib.sha256(head + fileio.pread_exact(fd, n, 8, shard)).hexdigest()
    finally:
        os.close(fd)


def small_files(ckpt: Checkpoint) -> list[dict[str, Any]]:
    """The checkpoint's files read whole, not tensor by tensor: ``config.json``, the index
    (if any) and the model card (if any), each with its ``size`` and the ``sha256`` of all its
    bytes (null above :data:`SMALL_FILE_BYTES`, or for a card that cannot be read).

    >>> [(f["name"], f["size"]) for f in small_files(Checkpoint.open("fixtures/checkpoints/olmoe"))]
    [('config.json', 815)]
    """
    out = []
    for name in ("config.json", "model.safetensors.index.json", CARD):
        path = ckpt.root / name
        if not os.path.lexists(path):
            continue
        try:
            size, digest = _sha256(path)
        except SmoeError:
            if name != CARD:  # config.json and the index were read already: an I/O error
                raise
            continue  # the card's own warning says why (read_card)
        out.append({"name": name, "size": size, "sha256": digest})
    return out


def _sha256(path: Path) -> tuple[int, str | None]:
    """The size of a regular file and the SHA-256 of its bytes (None above the bound)."""
    fd = fileio.open_input(path)
    try:
        size = os.fstat(fd).st_size
        if size > SMALL_FILE_BYTES:
            return size, None
        h = hashlib.sha256()
        for at in range(0, size, _CHUNK):
            h.update(fileio.pread_exact(fd, min(_CHUNK, size - at), at, path))
        return size, h.hexdigest()
    finally:
        os.close(fd)


def text_of(name: str) -> str:
    """A file name as the manifest's UTF-8 text: bytes that are not UTF-8 (which Python keeps
    as lone surrogates, which no strict JSON reader accepts) written as ``\\xNN``.

    >>> text_of(os.fsdecode(b"model-caf\\xe9.safetensors"))
    'model-caf\\\\xe9.safetensors'
    """
    return utf8_text(name)


def tensor_entries(
    ref: ExpertRef, tensors: Sequence[TensorOutcome], weighted: bool = False
) -> list[dict[str, Any]]:
    """Per tensor provenance of one expert for the manifest (docs/MANIFEST.md); with
    ``weighted`` (a run with an importance matrix) also ``weighted_snr_db``.

    >>> from smoe.sculpt.outcome import TensorOutcome
    >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe_fused").experts[(0, 1)]
    >>> tensors = [TensorOutcome(source_crc=7, snr=12.5, weighted_snr=13.123456)] * 3
    >>> gate = tensor_entries(ref, tensors, weighted=True)[0]
    >>> gate["source"], gate["index"], gate["rows"], gate["weighted_snr_db"]
    ('model.layers.0.mlp.experts.gate_up_proj', 1, [0, 48], 13.1235)
    """
    out: list[dict[str, Any]] = [
        {
            "name": name,
            "source": info.name,
            "index": idx,
            "rows": None if rows is None else [rows.start, rows.stop],
            "source_crc32c": t.source_crc,
            "snr_db": t.snr,
        }
        for name, (info, idx, rows), t in zip(TENSOR_NAMES, ref.sources, tensors)
    ]
    for entry, scale in zip(out, ref.scales):  # FP8: read with these scales, as BF16
        if scale is not None:
            entry["fp8"] = scale.record()
    if ref.transposed:  # the source slab holds the transposes: [E, H, 2I], [E, I, H]
        for entry in out:
            entry["transposed"] = True
    if weighted:
        for entry, t in zip(out, tensors):
            value = t.weighted_snr
            entry["weighted_snr_db"] = None if not finite(value) else round(float(value), 4)
    return out
