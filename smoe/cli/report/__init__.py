"""`smoe report`: one self-contained HTML page that pictures a vault.

The page (``smoe/cli/templates/report.html.j2``, rendered by jinja2 with autoescaping) holds
inline SVG and CSS only: no script, no external resource, it opens from disk. It shows a
map of the file (every region, blobs coloured by layer), the header and arch fields with
their offsets (``activation`` by name: ``silu (0)``, ``unknown (N)`` for a value the spec
does not name), per-layer sizes, the verifier's findings and, when the integrity manifest
(docs/MANIFEST.md) is there, per-expert quantisation SNR as a layer x expert heat map with
a histogram per tensor kind.

What the vault costs, in the summary and per layer (:func:`figures`):

- **weights**: the experts' weights, the sum over the table's experts of ``rows x cols`` of
  their three tensors (from the descriptors);
- **bits per weight**: blob bytes x 8 / weights, once with the blobs' ``raw_size`` (the
  packed codes and the fp16 group scales) and once with their ``padded_size`` (as stored,
  page padding included);
- **compression against BF16**: the same weights in BF16 (2 bytes each) / blob bytes, raw
  and padded (that is 16 / bits per weight);
- **streaming cost per token**: an engine that streams experts reads ``top_k`` blobs (the
  arch block's ``moe_top_k``) in each MoE layer of the file, so per layer ``top_k`` x the
  layer's mean blob size and in total the sum over the layers present: blobs per token
  ``top_k x layers``, bytes per token raw (``raw_size``) and as read in whole pages
  (``padded_size``), rounded to whole bytes. A version 1 vault has no arch block and hence
  no ``top_k``: its cost per token is "unknown (v1 vault)".

The heat map's colours are fixed bands of absolute SNR per bit width (:func:`snr_bands`),
not a scale stretched over the vault's own spread, so an expert's colour depends on its SNR
alone: :data:`SNR_BANDS` bands of :data:`SNR_BAND_STEP_DB` dB each from the width's floor
(``smoe.quant.SNR_FLOOR_DB``) up, the step being the distance from the floor to the SNR of
Gaussian weights (Q4 20.5 dB, Q2 9.5 dB) divided by :data:`SNR_BANDS`: Q4 10, 11.5, 13, 14.5,
16, 17.5 and 19 dB and up; Q2 2.5, 3.5, ..., 8.5 dB and up. A value above the last edge takes
the top colour; below the floor is red. The histograms' bars take the same colours.

The page stays small however large the vault: blobs are drawn per run of one layer (at most
:data:`MAX_RUNS` segments), the heat map is one SVG path per colour rather than one element
per expert, and per-expert tooltips are only written for vaults of up to
:data:`CELL_TITLES_MAX` experts (per-layer ones otherwise). Qwen3-235B's 12,032 experts
with a manifest give a page of about 0.3 MB.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smoe.cli.report.constants import (
    BELOW_FLOOR,
    MAX_ROWS,
    MAX_RUNS,
    REPORT_SIGNATURE,
    SCHEMA,
    SNR_BANDS,
    SNR_GAUSSIAN_DB,
    TEMPLATE,
)
from smoe.cli.report.filemap import fit_widths
from smoe.cli.report.layers import layer_colour
from smoe.cli.report.page import activation_name, collect, figures
from smoe.cli.report.snr import SNR_SHOWN, band_colour, snr_band, snr_bands, viridis
from smoe.cli.report.text import fmt_num, human
from smoe.errors import WriteFailed
from smoe.format import manifest as manifests
from smoe.format.verify import verify_file
from smoe.format.view import FileView
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile, refuse_foreign

__all__ = [
    "BELOW_FLOOR",
    "MAX_ROWS",
    "MAX_RUNS",
    "REPORT_SIGNATURE",
    "SCHEMA",
    "SNR_BANDS",
    "SNR_GAUSSIAN_DB",
    "SNR_SHOWN",
    "ReportResult",
    "activation_name",
    "band_colour",
    "collect",
    "figures",
    "fit_widths",
    "human",
    "layer_colour",
    "manifest_for",
    "render",
    "snr_band",
    "snr_bands",
    "viridis",
    "write_report",
]


@dataclass
class ReportResult:
    """What :func:`write_report` wrote and what it found.

    >>> import os, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "q4.html")
    >>> result = write_report("fixtures/q4_v2.smoe", out)
    >>> result.experts, result.layers, result.ok, result.snr
    (8, 2, True, False)
    >>> result.figures["weights"], result.figures["per_token"]["bytes_read"]
    (49152, 65536)
    """

    path: Path
    vault: Path
    bytes: int
    experts: int
    layers: int
    manifest: Path | None
    snr: bool
    ok: bool
    errors: int
    warnings: int
    unreadable: bool
    provenance: dict[str, Any] | None = None
    """The manifest's provenance and metadata (:func:`smoe.format.provenance.provenance_of`),
    or None without a readable manifest."""
    figures: dict[str, Any] | None = None
    """The vault's weights, bits per weight, compression and cost per token
    (:func:`figures`, less its per-layer part), or None when the header cannot be trusted."""

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document of ``smoe report``.

        >>> import os, tempfile
        >>> out = os.path.join(tempfile.mkdtemp(), "q4.html")
        >>> doc = write_report("fixtures/q4_v2.smoe", out).to_dict()
        >>> doc["schema"], doc["report"] == out, doc["vault"], doc["manifest"]
        ('smoe-report/1', True, 'fixtures/q4_v2.smoe', None)
        >>> doc["weights"], doc["bits_per_weight"], doc["compression_vs_bf16"]["raw"]
        (49152, {'raw': 4.25, 'padded': 21.333333333333332}, 3.764705882352941)
        >>> doc["per_token"]
        {'top_k': 2, 'blobs': 4, 'bytes_raw': 13056, 'bytes_read': 65536}
        """
        f = self.figures or {}
        tok = f.get("per_token") or {}
        return {
            "schema": SCHEMA,
            "report": str(self.path),
            "vault": str(self.vault),
            "bytes": self.bytes,
            "experts": self.experts,
            "layers": self.layers,
            "manifest": None if self.manifest is None else str(self.manifest),
            "snr": self.snr,
            "ok": self.ok,
            "errors": self.errors,
            "warnings": self.warnings,
            "provenance": self.provenance,
            "weights": f.get("weights"),
            "bits_per_weight": {"raw": f.get("bits_raw"), "padded": f.get("bits_padded")},
            "compression_vs_bf16": {"raw": f.get("vs_bf16_raw"), "padded": f.get("vs_bf16_padded")},
            "per_token": {k: tok.get(k) for k in ("top_k", "blobs", "bytes_raw", "bytes_read")},
        }


def write_report(
    vault: str | os.PathLike,
    out: str | os.PathLike,
    deep: bool = False,
    manifest: str | os.PathLike | None = "auto",
    replace: bool = True,
) -> ReportResult:
    """Write the report page of ``vault`` to ``out`` atomically (``replace`` False, as
    ``smoe report`` without ``--force``: an existing ``out`` is refused and never replaced).

    ``manifest``: "auto" (the sidecar ``VAULT.manifest.json`` when it exists), a path, or
    None (no SNR). ``deep`` also reads every blob and checks them against the manifest, as
    ``smoe verify --deep`` does. An output that is the vault or its manifest (also through
    symlinks or hard links), or a folder, is refused before anything is written, and so is a
    named ``manifest`` that is not a regular file (a missing one is not "no manifest"). A
    vault that breaks rules still gets its page (its findings are on it).

    >>> import os, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "q4.html")
    >>> write_report("fixtures/q4_v2.smoe", out).bytes == os.path.getsize(out)
    True
    >>> write_report("fixtures/q4_v2.smoe", "fixtures/q4_v2.smoe")
    Traceback (most recent call last):
    smoe.errors.WriteFailed: fixtures/q4_v2.smoe: the output is the input ... itself; ...
    """
    vault, out = Path(vault), Path(out)
    side = manifest_for(vault, manifest)
    if side is not None and not (isinstance(manifest, str) and manifest == "auto"):
        fileio.require_regular(side)  # a named manifest that is not there: refused (exit 2)
    fileio.refuse_same_file(out, [vault, manifests.path_for(vault), *([side] if side else [])])
    if out.is_dir():
        raise WriteFailed(f"{out}: is a folder; name the .html file to write")
    if not replace:
        fileio.refuse_existing(out)
    else:
        refuse_foreign(out, REPORT_SIGNATURE)
    with FileView.open(vault) as view:
        report = verify_file(view, vault, deep=deep, manifest=manifest)
        context = collect(view, vault, report, side, deep)
    html = render(context).encode("utf-8")
    with AtomicFile(out, replace=replace, ours=REPORT_SIGNATURE) as f:
        f.pwrite(html, 0)
        f.commit()
    return ReportResult(
        path=out,
        vault=vault,
        bytes=len(html),
        experts=context["experts"],
        layers=context["layer_count"],
        manifest=side if context["snr"] is not None else None,
        snr=context["snr"] is not None,
        ok=report.ok,
        errors=len(report.errors),
        warnings=sum(f.severity == "warning" for f in report.findings),
        unreadable=any(f.code == "header.size" for f in report.errors),
        provenance=context["provenance"]["doc"] if context["provenance"] else None,
        figures=_without_layers(context["figures"]),
    )


def _without_layers(fig: dict[str, Any] | None) -> dict[str, Any] | None:
    """:func:`figures` less its per-layer part (the page's, not ``--json``'s)."""
    return None if fig is None else {k: v for k, v in fig.items() if k != "layers"}


def manifest_for(vault: Path, manifest: str | os.PathLike | None) -> Path | None:
    """The manifest whose SNR the page shows: the sidecar when it exists ("auto"), the
    given file, or None.

    >>> manifest_for(Path("fixtures/q4_v2.smoe"), "auto")
    PosixPath('fixtures/q4_v2.smoe.manifest.json')
    >>> manifest_for(Path("fixtures/q4_v2.smoe"), None) is None
    True
    """
    if manifest is None:
        return None
    if isinstance(manifest, str) and manifest == "auto":
        side = manifests.path_for(vault)
        return side if os.path.lexists(side) else None
    return Path(manifest)


def render(context: dict[str, Any]) -> str:
    """The page for a :func:`collect` context.

    >>> from smoe.format.verify import verify_file
    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     report = verify_file(view, "fixtures/q4_v2.smoe")
    ...     context = collect(view, Path("fixtures/q4_v2.smoe"), report, None, deep=False)
    >>> page = render(context)
    >>> page.startswith("<!DOCTYPE html>"), "<script" in page
    (True, False)
    """
    return _template().render(**context)


@functools.lru_cache(maxsize=1)
def _template() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("smoe.cli", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=fmt_num, human=human, hexa=lambda v: f"{int(v):#x}")
    return env.get_template(TEMPLATE)
