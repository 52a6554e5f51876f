"""Whether a folder is the checkpoint a vault was sculpted from: ``export --hf`` refuses to
write there with or without ``--force``, since its files were never smoe's to delete.

Known by the vault's manifest: a shard with the size and header SHA-256 it records of its
source, whose bytes give a source tensor's recorded CRC-32C (an earlier export has the same
header but dequantised bytes).
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

from smoe.errors import SmoeError
from smoe.export.hf.folder import MAX_FILES
from smoe.format.manifest import checksum
from smoe.interop.safetensors_io import read_header
from smoe.plumbing import fileio
from smoe.sculpt.provenance import header_sha256

__all__ = ["source_checkpoint"]


def source_checkpoint(out_dir: Path, doc: dict[str, Any] | None) -> str | None:
    """Why ``out_dir`` is the checkpoint the vault was sculpted from, by its manifest
    ``doc`` (None: it is not, as far as the manifest tells): one of its shards has the size
    and header SHA-256 the manifest records (``source.files``), and its bytes give a source
    tensor's recorded CRC-32C (an export with the same header holds dequantised bytes,
    which do not; a manifest without one: the header decides).

    >>> import tempfile
    >>> ckpt = Path("fixtures/checkpoints/qwen3_moe")
    >>> shard = ckpt / "model.safetensors"
    >>> doc = {"source": {"files": [{"name": "model.safetensors", "size": shard.stat().st_size,
    ...                              "header_sha256": header_sha256(shard)}]}}
    >>> source_checkpoint(ckpt, doc)
    "model.safetensors has the size and header SHA-256 the vault's manifest records of its ..."
    >>> source_checkpoint(Path(tempfile.mkdtemp()), doc), source_checkpoint(ckpt, None)
    (None, None)
    """
    source = doc.get("source") if isinstance(doc, dict) else None
    files = source.get("files") if isinstance(source, dict) else None
    if doc is None or not isinstance(files, list):
        return None
    for entry in files[:MAX_FILES]:
        shard = _recorded_shard(out_dir, entry)
        if shard is not None and _holds_source_bytes(shard, doc):
            return (
                f"{entry['name']} has the size and header SHA-256 the vault's manifest "
                "records of its source, and a source tensor's bytes"
            )
    return None


def _recorded_shard(out_dir: Path, entry: object) -> Path | None:
    """``out_dir``'s file of a ``source.files`` entry, when its size and header match."""
    if not isinstance(entry, dict):
        return None
    name, size, want = entry.get("name"), entry.get("size"), entry.get("header_sha256")
    if not isinstance(name, str) or not isinstance(want, str) or type(size) is not int:
        return None
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    path = out_dir.joinpath(*parts)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return None
        return path if header_sha256(path) == want else None
    except (OSError, SmoeError, ValueError):
        return None


def _holds_source_bytes(shard: Path, doc: dict[str, Any]) -> bool:
    """Whether a source tensor of ``shard`` has the CRC-32C the manifest records; True
    when the manifest records none that can be checked here."""
    try:
        header = read_header(shard)
    except (SmoeError, OSError):
        return True
    for row in doc.get("experts") or []:
        for t in (row.get("tensors") or []) if isinstance(row, dict) else []:
            span = _span(header, t) if isinstance(t, dict) else None
            if span is None:
                continue
            start, length = span
            fd = fileio.open_input(shard)
            try:
                data = fileio.pread_exact(fd, length, start, shard)
            except SmoeError:
                return True
            finally:
                os.close(fd)
            return checksum(data) == t["source_crc32c"]
    return True


def _span(header: dict[str, Any], t: dict[str, Any]) -> tuple[int, int] | None:
    """(offset, length) of a manifest tensor record's source bytes in the shard whose
    ``header`` holds its source (None: not there, transposed, or not checkable)."""
    name = t.get("source")
    info = header.get(name) if isinstance(name, str) else None
    crc, index, rows = t.get("source_crc32c"), t.get("index"), t.get("rows")
    if info is None or type(crc) is not int or t.get("transposed") or not info.shape:
        return None
    count = math.prod(info.shape)
    if count == 0:
        return None
    item = info.nbytes // count
    shape, start, length = info.shape, info.offset, info.nbytes
    if index is not None:
        if type(index) is not int or not 0 <= index < shape[0] or len(shape) < 2:
            return None
        length //= shape[0]
        start += index * length
        shape = shape[1:]
    if rows is not None:
        if not (isinstance(rows, list) and len(rows) == 2 and all(type(r) is int for r in rows)):
            return None
        row = length // shape[0]
        if not 0 <= rows[0] < rows[1] <= shape[0]:
            return None
        start, length = start + rows[0] * row, (rows[1] - rows[0]) * row
    return (start, length) if item > 0 else None
