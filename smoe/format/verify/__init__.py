"""Every rule of the format, checked over a file read with ``pread`` (or an array).

Each rule of the spec's registry (``smoe_gen.layout.Rule``, shared with the C++ harness)
has one small checker, registered by its code (:mod:`.rules`); the checkers come in
sections, one module each, run in this order, each needing what the one before located:

* :mod:`.header`: the header, and where the arch block may lie; its gates decide whether
  anything else can be located (a failed one ends the verdict there);
* :mod:`.arch`: the arch block (version 2, when it lies inside the file), then
  ``header.ffn_dim``, which weighs the header against it;
* :mod:`.table`: the expert table, vectorised over it (read once, when it lies inside the
  file); it says which blobs lie inside the file;
* :mod:`.descriptors`: the descriptors and shapes, vectorised; they say which experts'
  slices are sound;
* :mod:`.blobs` (``deep`` only): the padding, scales and last code bytes of those
  experts' blobs, read expert by expert in bounded pieces, and the gap before them; then
  the manifest beside the vault (docs/MANIFEST.md), when every blob lies inside the file.

A 12,032-expert table checks in milliseconds. fixtures/corrupt/EXPECTED.json names the
code each corrupt fixture must raise. Offsets and sizes come from the generated layout's
helpers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from smoe.format import manifest as manifests
from smoe.format.verify.arch import check_arch, check_ffn_dim
from smoe.format.verify.blobs import check_blobs, check_manifest, read_manifest
from smoe.format.verify.descriptors import check_descriptors
from smoe.format.verify.header import check_header
from smoe.format.verify.report import MAX_PER_CODE, Report
from smoe.format.verify.table import check_table
from smoe.format.view import Data, FileView, arch_view, header_view, table_views
from smoe_gen import layout

__all__ = [
    "MAX_PER_CODE",
    "Report",
    "check_arch",
    "check_descriptors",
    "check_header",
    "check_table",
    "verify",
    "verify_file",
    "verify_path",
]


def verify(data: Data, deep: bool = False, manifest: dict[str, Any] | None = None) -> Report:
    """All rules over the whole file (a :class:`FileView` or a uint8 array).

    With ``deep``, blob contents are read too and, given a manifest loaded by
    ``smoe.format.manifest.load``, every blob is checked against it. A file that shrinks while
    it is read raises :class:`SmoeError`.

    >>> import numpy as np
    >>> from smoe.format import manifest
    >>> data = np.fromfile("fixtures/q4_v2.smoe", np.uint8)
    >>> doc = manifest.load("fixtures/q4_v2.smoe.manifest.json", entries=8)
    >>> verify(data, deep=True, manifest=doc).ok
    True
    >>> data[16384] ^= 1  # a bit of the first blob
    >>> [(f.code, f.path) for f in verify(data, deep=True, manifest=doc).errors]
    [('manifest.checksum', 'manifest/experts/0/crc32c')]
    """
    report = Report(size=len(data))
    geo = check_header(data, report)
    report.geometry = geo
    if geo is None:
        return report  # as found: a failed gate ends the verdict
    header = header_view(data)
    arch = None
    if geo.version >= layout.VERSION_WITH_ARCH and geo.arch_readable:
        check_arch(data, geo, report)
        arch = arch_view(data, geo)
    check_ffn_dim(header, arch, report)
    if not geo.table_readable:
        report.sort()
        return report
    table, descs = table_views(data, geo)
    inside = check_table(table, geo, report, header)
    sound = check_descriptors(table, descs, geo, report, header, arch) & inside
    if deep:
        check_blobs(data, table, descs, geo, report, sound)
        if manifest is not None and inside.all():  # every blob can be read
            check_manifest(manifest, data, geo, table, report)
    report.sort()
    return report


def _manifest_path(
    vault: str | os.PathLike, deep: bool, manifest: str | os.PathLike | None = "auto"
) -> Path | None:
    """The manifest to check: "auto" = the sidecar when it exists (and ``deep``), a path =
    that file (when ``deep``), None = none."""
    if not deep or manifest is None:
        return None
    if isinstance(manifest, str) and manifest == "auto":
        side = manifests.path_for(vault)
        return side if os.path.lexists(side) else None
    return Path(manifest)


def verify_file(
    data: Data,
    path: str | os.PathLike,
    deep: bool = False,
    manifest: str | os.PathLike | None = "auto",
) -> Report:
    """:func:`verify` of the vault at ``path`` already opened as ``data``, with its manifest
    (``manifest``: "auto" = the sidecar ``<vault>.manifest.json`` when it exists, a path =
    that file, None = none; checked only with ``deep``); a manifest that cannot be read is a
    ``manifest.malformed`` finding.

    >>> other = "fixtures/q2_v2.smoe.manifest.json"  # the manifest of another vault
    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     report = verify_file(view, "fixtures/q4_v2.smoe", deep=True, manifest=other)
    >>> [f.code for f in report.errors]
    ['manifest.expert']
    """
    where = _manifest_path(path, deep, manifest)
    doc, problem = read_manifest(data, where) if where is not None else (None, None)
    report = verify(data, deep=deep, manifest=doc)
    if problem is not None:
        report.add(problem)
        report.sort()
    return report


def verify_path(
    path: str | os.PathLike, deep: bool = False, manifest: str | os.PathLike | None = "auto"
) -> Report:
    """Open ``path`` (``fileio.NotRegular`` for FIFOs, folders, devices, missing files) and
    :func:`verify_file` it.

    >>> report = verify_path("fixtures/partial_vault.smoe")
    >>> report.ok, [(f.severity, f.code) for f in report.findings]
    (True, [('warning', 'arch.rms_norm_eps'), ('info', 'header.partial')])
    >>> print(report.findings[1].line())
    info: header.partial at offset 0x14 (header.total_experts): partial: 4 of 32 experts
    """
    with FileView.open(path) as view:
        return verify_file(view, path, deep=deep, manifest=manifest)
