"""`smoe report`'s figures (issue 25): the experts' weights, bits per weight and compression
against BF16, the streaming cost per token, the fixed dB colour bands of the SNR heat map and
``activation`` by name, on the page and in ``--json``, each checked against numbers computed
here from the vault itself."""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import struct
from fractions import Fraction
from pathlib import Path

import pytest
from test_report import Page

from smoe.cli import report
from smoe.cli.report import band_colour, snr_band, snr_bands, write_report
from smoe.format import manifest
from smoe.quant import SNR_FLOOR_DB
from smoe.vault.reader import Vault

from fixtures_data import FIXTURES, GOOD, ROOT
from helpers import run

NEW_KEYS = {"weights", "bits_per_weight", "compression_vs_bf16", "per_token"}


def expected_figures(path: Path) -> dict:
    """The figures of ``path`` from its experts as the reader opens them: the weights from
    each tensor's shape, the blob bytes from the table (and, for the raw size, also from
    the codes and scales each tensor holds), the top-k from the arch block."""
    with Vault.open(path) as v:
        weights = raw_held = 0
        layers: dict[int, dict[str, int]] = {}
        for (layer, _), expert in v.items():
            lay = layers.setdefault(layer, {"n": 0, "weights": 0, "raw": 0, "padded": 0})
            lay["n"] += 1
            for t in expert.tensors:
                rows, cols = t.shape
                weights += rows * cols
                lay["weights"] += rows * cols
                raw_held += t.packed.nbytes + t.scales.nbytes
        for entry in v.table:
            lay = layers[int(entry["layer_id"])]
            lay["raw"] += int(entry["raw_size"])
            lay["padded"] += int(entry["padded_size"])
        raw = sum(int(x) for x in v.table["raw_size"])
        padded = sum(int(x) for x in v.table["padded_size"])
        assert raw == raw_held  # a blob's raw bytes: its codes and fp16 scales, nothing else
        top_k = None if v.arch is None else int(v.arch["moe_top_k"])
    per_token: dict = {"top_k": top_k, "blobs": None, "bytes_raw": None, "bytes_read": None}
    if top_k is not None:
        per_token["blobs"] = top_k * len(layers)
        per_token["bytes_raw"] = round(
            sum(Fraction(top_k * d["raw"], d["n"]) for d in layers.values())
        )
        per_token["bytes_read"] = round(
            sum(Fraction(top_k * d["padded"], d["n"]) for d in layers.values())
        )
    return {
        "weights": weights,
        "bits_per_weight": {"raw": raw * 8 / weights, "padded": padded * 8 / weights},
        "compression_vs_bf16": {"raw": 2 * weights / raw, "padded": 2 * weights / padded},
        "per_token": per_token,
        "layers": layers,
    }


def cards(html: str) -> dict[str, tuple[str, str]]:
    """The summary cards: key -> (value, the line under it)."""
    found = re.findall(
        r'<div class="card"><div class="k">(.*?)</div><div class="v">(.*?)</div>'
        r'<div class="sub">(.*?)</div></div>',
        html,
    )
    return {k: (v, sub) for k, v, sub in found}


def words(page: Page) -> str:
    """The page's text, its whitespace collapsed."""
    return " ".join("".join(page.text).split())


# ---- weights, bits per weight, compression, cost per token -----------------------------------
@pytest.mark.parametrize("name", GOOD)
def test_figures_of_every_fixture_vault(name: str, tmp_path: Path) -> None:
    doc = write_report(FIXTURES / name, tmp_path / "r.html").to_dict()
    want = expected_figures(FIXTURES / name)
    assert doc["weights"] == want["weights"]
    for key in ("bits_per_weight", "compression_vs_bf16"):
        assert doc[key] == pytest.approx(want[key]), key
    assert doc["per_token"] == want["per_token"]
    assert (doc["per_token"]["top_k"] is None) == name.endswith("_v1.smoe")


def test_q4_v2_figures_and_page(tmp_path: Path) -> None:
    """fixtures/q4_v2.smoe: 8 experts of 32x64, 32x64, 64x32 in 2 layers, 3,264-byte blobs in
    one 16 KiB page each, top-2."""
    out = tmp_path / "q4.html"
    doc = write_report(FIXTURES / "q4_v2.smoe", out).to_dict()
    assert doc["weights"] == 8 * 3 * 2048 == 49_152
    assert doc["bits_per_weight"] == {"raw": 4.25, "padded": 131_072 * 8 / 49_152}
    assert doc["compression_vs_bf16"] == {"raw": 98_304 / 26_112, "padded": 0.75}
    assert doc["per_token"] == {"top_k": 2, "blobs": 4, "bytes_raw": 13_056, "bytes_read": 65_536}
    html = out.read_text()
    c = cards(html)
    assert c["expert weights"] == ("49,152", "BF16: 96.0 KiB")
    assert c["bits per weight"] == ("4.250", "21.333 with page padding")
    assert c["compression vs BF16"] == ("3.76×", "0.75× with page padding")
    assert c["read per token"] == ("64.0 KiB", "4 blobs (top-2 × 2 layers), data 12.8 KiB")
    page = Page(html)
    text = words(page)
    assert (
        "Per token, an engine that streams experts reads top-2 blobs in each MoE layer of this "
        "file: moe_top_k × the layer's mean blob size, summed over the 2 layers here, as read in "
        "whole pages and as data (raw)."
    ) in text
    assert (
        "Bits per weight: blob bytes × 8 ÷ the experts' weights (rows × cols of their three "
        "tensors, from the descriptors), with the codes and fp16 group scales (raw_size) and "
        "with page padding (padded_size); compression vs BF16: the same weights at 2 bytes "
        "each ÷ blob bytes."
    ) in text
    head = next(r for r in page.rows if r[:2] == ["layer", "experts"])
    assert head[9:11] == ["bits / weight", "read (data) / token"]
    for layer in (0, 1):
        row = page.row(str(layer), "4")
        assert row[9:11] == ["4.250 · 21.333", "32.0 KiB (6.4 KiB)"]


def test_per_layer_figures_follow_each_layers_blobs(tmp_path: Path) -> None:
    """deepseek_v2.smoe (layers 1 and 2) and partial_vault.smoe (some experts missing): each
    row's bits per weight and cost per token are that layer's own."""
    for name in ("deepseek_v2.smoe", "partial_vault.smoe", "q2_v2.smoe"):
        out = tmp_path / f"{name}.html"
        write_report(FIXTURES / name, out)
        page = Page(out.read_text())
        want = expected_figures(FIXTURES / name)
        top_k = want["per_token"]["top_k"]
        for layer, d in want["layers"].items():
            row = page.row(str(layer), str(d["n"]))
            bits = f"{d['raw'] * 8 / d['weights']:.3f} · {d['padded'] * 8 / d['weights']:.3f}"
            read = round(Fraction(top_k * d["padded"], d["n"]))
            data = round(Fraction(top_k * d["raw"], d["n"]))
            assert row[9:11] == [bits, f"{report.human(read)} ({report.human(data)})"], name


def test_a_v1_vault_has_no_cost_per_token(tmp_path: Path) -> None:
    out = tmp_path / "v1.html"
    result = write_report(FIXTURES / "q4_v1.smoe", out)
    assert result.to_dict()["per_token"] == {
        "top_k": None,
        "blobs": None,
        "bytes_raw": None,
        "bytes_read": None,
    }
    html = out.read_text()
    c = cards(html)
    assert c["read per token"] == (
        "unknown (v1 vault)",
        "a v1 vault has no arch block, so no moe_top_k",
    )
    assert c["bits per weight"] == ("4.250", "21.333 with page padding")  # known all the same
    page = Page(html)
    assert "unknown (v1 vault) here, without moe_top_k." in words(page)
    head = next(r for r in page.rows if r[:2] == ["layer", "experts"])
    assert "read (data) / token" not in head and "bits / weight" in head


def test_json_keys_are_documented_and_null_where_unknown(tmp_path: Path) -> None:
    """The --json document has the new keys, docs/JSON.md's Report document table lists
    every key, and a file whose header cannot be trusted gives nulls."""
    body = (ROOT / "docs" / "JSON.md").read_text().split("\n## Report document\n", 1)[1]
    table = body.split("\n## ", 1)[0]
    documented = {
        k
        for cell in re.findall(r"^\| ([^|]+) \|", table, re.M)
        for k in re.findall(r"`(\w+)`", cell)
    }
    proc = run("report", FIXTURES / "q2_v2.smoe", "-o", tmp_path / "q2.html", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) >= NEW_KEYS and set(doc) == documented
    assert doc["per_token"] == {"top_k": 2, "blobs": 4, "bytes_raw": 6_912, "bytes_read": 65_536}
    assert doc["bits_per_weight"]["raw"] == 13_824 * 8 / 49_152 == 2.25
    short = tmp_path / "short.smoe"
    short.write_bytes(b"SMOE")
    proc = run("report", short, "-o", tmp_path / "short.html", "--json")
    doc = json.loads(proc.stdout)
    assert doc["weights"] is None
    assert doc["bits_per_weight"] == doc["compression_vs_bf16"] == {"raw": None, "padded": None}
    assert set(doc["per_token"].values()) == {None}


# ---- activation by name --------------------------------------------------------------------
def test_activation_is_shown_by_name(tmp_path: Path) -> None:
    src = FIXTURES / "q4_v2.smoe"
    with Vault.open(src) as v:
        at = int(v.header["reserved_ext"]) + 48  # arch_block.activation
    out = tmp_path / "silu.html"
    write_report(src, out)
    assert Page(out.read_text()).row(str(at), "activation")[2] == "silu (0)"
    odd = tmp_path / "odd.smoe"
    shutil.copyfile(src, odd)
    with open(odd, "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<I", 7))
    result = write_report(odd, tmp_path / "odd.html")
    assert not result.ok  # arch.activation is broken, and the page says what it holds
    page = Page((tmp_path / "odd.html").read_text())
    assert page.row(str(at), "activation")[2] == "unknown (7)"
    assert report.activation_name(0) == "silu (0)"


# ---- fixed dB colour bands -----------------------------------------------------------------
def with_snr(src: Path, folder: Path, snr: dict[tuple[int, int], float]) -> Path:
    """A copy of ``src`` whose manifest records, per (layer, expert), ``snr`` dB for its
    gate_proj and 1 dB more for up_proj and down_proj (the expert's lowest is ``snr``)."""
    folder.mkdir()
    vault = folder / src.name
    shutil.copyfile(src, vault)
    doc = json.loads(manifest.path_for(src).read_text())
    for row in doc["experts"]:
        s = snr[(row["layer"], row["expert"])]
        row["tensors"] = [
            {"name": n, "snr_db": v}
            for n, v in zip(("gate_proj", "up_proj", "down_proj"), (s, s + 1, s + 1))
        ]
    manifest.path_for(vault).write_bytes(manifest.encode(doc))
    return vault


def cell_fills(html: str) -> dict[tuple[int, int], str]:
    """The heat map's fill per cell (expert id, row), from its one path per colour."""
    fills = {}
    for fill, d in re.findall(r'<path fill="([^"]+)" d="((?:M\d+ \d+h\d+v1h-\d+z)+)"', html):
        for x, y, n in re.findall(r"M(\d+) (\d+)h(\d+)", d):
            for i in range(int(x), int(x) + int(n)):
                fills[(i, int(y))] = fill
    return fills


def test_an_experts_colour_depends_on_its_snr_alone(tmp_path: Path) -> None:
    """Expert (0, 1) at 18.2 dB has the same colour whether the others spread over 0.4 dB or
    over 35; values beyond the last band take the top colour; below the floor is red."""
    src = FIXTURES / "q4_v2.smoe"
    keys = [(la, e) for la in (0, 1) for e in range(4)]
    tight = {k: 18.0 + 0.05 * i for i, k in enumerate(keys)}
    wide = dict(zip(keys, (5.0, 18.2, 10.0, 19.0, 40.0, 1e4, 9.99, 13.0)))
    tight[(0, 1)] = 18.2
    fills = {}
    for name, snr in (("tight", tight), ("wide", wide)):
        out = tmp_path / f"{name}.html"
        write_report(with_snr(src, tmp_path / name, snr), out)
        fills[name] = cell_fills(out.read_text())
        for (layer, expert), s in snr.items():
            assert fills[name][(expert, layer)] == band_colour(snr_band(s, 4)), (name, s)
    assert (
        fills["tight"][(1, 0)] == fills["wide"][(1, 0)] == band_colour(5) == report.viridis(5 / 6)
    )
    w = fills["wide"]  # cells are (expert id, row); the rows are layers 0 and 1
    # 5 and 9.99 dB are below the Q4 floor: red; 10 dB is the first band, 13 dB the third;
    # 19, 40 and 10,000 dB all take the top colour
    assert w[(0, 0)] == w[(2, 1)] == report.BELOW_FLOOR
    assert w[(2, 0)] == band_colour(0) == "#440154"
    assert w[(3, 1)] == band_colour(2)
    assert w[(3, 0)] == w[(0, 1)] == w[(1, 1)] == band_colour(report.SNR_BANDS - 1) == "#fde725"


def test_band_rule_and_legend(tmp_path: Path) -> None:
    """The bands: SNR_BANDS of them from each width's floor, Q4 1.5 dB and Q2 1 dB wide; the
    legend names each with its range and count, word for word."""
    assert snr_bands(4) == (10.0, 11.5, 13.0, 14.5, 16.0, 17.5, 19.0)
    assert snr_bands(2) == (2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5)
    for bits, floor in SNR_FLOOR_DB.items():
        assert snr_bands(bits)[0] == floor
        assert snr_band(floor, bits) == 0 and snr_band(floor - 1e-9, bits) == -1
        assert snr_band(report.SNR_GAUSSIAN_DB[bits], bits) == report.SNR_BANDS - 1
    src = FIXTURES / "q2_v2.smoe"
    keys = [(la, e) for la in (0, 1) for e in range(4)]
    vault = with_snr(
        src, tmp_path / "q2", dict(zip(keys, (2.0, 2.5, 3.0, 7.3, 9.1, 9.5, 9.7, 30.0)))
    )
    out = tmp_path / "q2.html"
    write_report(vault, out)
    html = out.read_text()
    page = Page(html)
    legend = [t for t in page.titles if re.search(r"dB(:| and above:) [\d,]+ experts?$", t)]
    assert legend == [
        "below the floor, 2.5 dB: 1 expert",
        "2.5 dB up to 3.5 dB: 2 experts",
        "3.5 dB up to 4.5 dB: 0 experts",
        "4.5 dB up to 5.5 dB: 0 experts",
        "5.5 dB up to 6.5 dB: 0 experts",
        "6.5 dB up to 7.5 dB: 1 expert",
        "7.5 dB up to 8.5 dB: 0 experts",
        "8.5 dB and above: 4 experts",
    ]
    labels = re.findall(
        r'<text x="[\d.]+" y="40" font-size="9.5" fill="#64748b" [^>]*>([^<]*)</text>', html
    )
    assert [html_lib.unescape(x) for x in labels] == [
        "< 2.5",
        "2.5–3.5",
        "3.5–4.5",
        "4.5–5.5",
        "5.5–6.5",
        "6.5–7.5",
        "7.5–8.5",
        "≥ 8.5",
    ]
    assert (
        "The colours are fixed bands of absolute SNR, 1 dB wide from 2.5 dB, the top one from "
        "8.5 dB up, red below the floor: the same SNR has the same colour in every Q2 vault, "
        "whatever the others' spread."
    ) in words(page)
    assert "lowest SNR of the expert (dB), Q2 bands" in words(page)
    # the histograms' bars take the colours of the bands their middles fall in
    bars = re.findall(
        r'fill="(#[0-9a-f]+)"><title>\w+: \d+ tensors with SNR ([-\d.]+)\.\.([-\d.]+) dB', html
    )
    assert bars
    for fill, lo, hi in bars:
        assert fill == band_colour(snr_band((float(lo) + float(hi)) / 2, 2)), (lo, hi)
