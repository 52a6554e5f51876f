"""`smoe report`: the HTML page of a vault — what it shows, that it is self-contained and
small at Qwen3-235B scale, that it is written safely, and that a real headless browser
(Debian's ``chromium``) renders it without console errors into a picture that is not blank."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from smoe.cli import report
from smoe.cli.report import fit_widths, write_report
from smoe.errors import SmoeError
from smoe.format import manifest
from smoe.format.plan import make_plan
from smoe.format.records import ArchInfo, ModelInfo, metadata_bytes
from smoe.plumbing.atomic import AtomicFile
from smoe.sculpt import SculptOptions, SculptResult, sculpt
from smoe.vault.reader import Vault
from smoe_testkit.synth import write_sparse_vault

from fixtures_data import BAD, CORRUPT, EXPECTED, FIXTURES
from helpers import HANG_GUARD, plain_env, run

CHECKPOINT = FIXTURES / "checkpoints" / "qwen3_moe"


class Page(HTMLParser):
    """The parts of a page the tests look at: SVG tooltips, table rows, section titles,
    every attribute, and the text."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.titles: list[str] = []
        self.rows: list[list[str]] = []
        self.h2: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []  # (tag, name, value)
        self.tags: list[str] = []
        self.text: list[str] = []
        self._stack: list[str] = []
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = []
        self._stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        if self._stack and self._stack[-1] == tag:
            self._stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        top = self._stack[-1] if self._stack else ""
        if top == "title":
            self.titles.append(data)
        elif top == "h2":
            self.h2.append(data.strip())

    def row(self, first: str, second: str | None = None) -> list[str]:
        """The table row whose first cells are ``first`` (and ``second``)."""
        for r in self.rows:
            if r and r[0] == first and (second is None or (len(r) > 1 and r[1] == second)):
                return r
        raise AssertionError(f"no row {first} {second or ''}")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo vault (`make demo`'s): the bundled qwen3_moe checkpoint, sculpted."""
    out = tmp_path_factory.mktemp("demo")
    result = sculpt(CHECKPOINT, out, SculptOptions(jobs=1))
    assert isinstance(result, SculptResult) and manifest.path_for(result.vault).exists()
    return result.vault


def synthetic_manifest(vault: Path, seed: int = 0) -> dict:
    """A manifest for a vault with made-up SNR (healthy, a few below the floor, a few
    exact), as smoe sculpt writes it."""
    v = Vault.open(vault)
    rng = np.random.default_rng(seed)
    snr = rng.normal(17.5, 0.6, (len(v.table), 3)).round(4)
    low = rng.choice(np.arange(10, len(snr)), 5, replace=False)
    snr[low, 2] = 7.25
    rows = []
    for i, e in enumerate(v.table.tolist()):
        layer, expert, offset, raw = e[0], e[1], e[2], e[3]
        values: list[float | None] = snr[i].tolist()
        if i in (3, 4):
            values = [None, None, None]
        rows.append(
            {
                "layer": layer,
                "expert": expert,
                "offset": offset,
                "raw_size": raw,
                "crc32c": 0,
                "tensors": [
                    {
                        "name": n,
                        "snr_db": s,
                        "source": f"t{n}",
                        "index": None,
                        "rows": None,
                        "source_crc32c": 0,
                    }
                    for n, s in zip(("gate_proj", "up_proj", "down_proj"), values)
                ],
            }
        )
    v.close()
    doc = {
        "schema": manifest.SCHEMA,
        "checksum": manifest.CHECKSUM,
        "vault": {
            "name": vault.name,
            "size": vault.stat().st_size,
            "experts": len(rows),
            "bits": 4,
        },
        "tool": {"name": "test"},
        "source": None,
        "experts": rows,
    }
    manifest.path_for(vault).write_bytes(manifest.encode(doc))
    return doc


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3-235B-A22B's geometry (94 x 128 experts, ~120 GB apparent, blobs as holes) with
    a manifest of made-up SNR."""
    vault = write_sparse_vault(tmp_path_factory.mktemp("big") / "qwen3_235b.smoe")
    synthetic_manifest(vault)
    return vault


# ---- what the page shows -----------------------------------------------------------------
def test_demo_page_shows_fields_layers_map_and_snr(demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = write_report(demo, out)
    assert (result.path, result.experts, result.layers, result.snr, result.ok) == (
        out,
        16,
        2,
        True,
        True,
    )
    assert result.manifest == manifest.path_for(demo)
    html = out.read_text("utf-8")
    assert result.bytes == len(html.encode())
    page = Page(html)
    assert page.h2[:3] == ["Map of the file", "Quantisation SNR per expert", "Layers"]
    v = Vault.open(demo)
    data_offset, ext = int(v.header["data_offset"]), int(v.header["reserved_ext"])
    # header and arch fields with their absolute offsets
    assert page.row("32", "data_offset")[2] == f"{data_offset} ({data_offset:#x})"
    assert page.row("44", "bits")[2] == "4"
    assert page.row(str(ext + 60), "model_type")[2] == "'qwen3_moe'"
    assert page.row(str(ext + 12), "flags")[2] == "0x3 = norm_topk_prob | has_qk_norm"
    # the map's regions, to the byte
    assert page.row("header")[1:4] == ["0", "0x0", "64"]
    assert page.row("expert table")[1:4] == ["64", "0x40", f"{16 * 48:,}"]
    assert page.row("arch block")[1:4] == [f"{ext:,}", f"{ext:#x}", "128"]
    assert page.row("zero gap")[3] == f"{data_offset - ext - 128:,}"
    # per layer: experts and bytes
    for layer in (0, 1):
        row = page.row(str(layer), "8")
        padded = int(v.table["padded_size"][v.table["layer_id"] == layer].sum())
        assert row[1:3] == ["8", "0-7"] and row[5] == f"{padded:,}"
    # one heat-map cell (with its tooltip) per expert, the three SNRs of each
    doc = json.loads(manifest.path_for(demo).read_text())
    cells = [t for t in page.titles if re.match(r"layer \d+ expert \d+: gate", t)]
    assert len(cells) == 16
    first = doc["experts"][0]
    gate, up, down = (t["snr_db"] for t in first["tensors"])
    assert f"layer 0 expert 0: gate {gate:.2f} dB, up {up:.2f} dB, down {down:.2f} dB" in cells
    # a histogram per tensor kind, and the findings (none)
    text = " ".join(page.text)
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert f"{name} · 16 tensors" in text
    assert "None: the vault follows every rule" in text


def test_without_a_manifest_the_page_says_so(demo: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.smoe"
    shutil.copyfile(demo, bare)
    result = write_report(bare, tmp_path / "bare.html")
    assert (result.snr, result.manifest) == (False, None)
    page = Page((tmp_path / "bare.html").read_text())
    assert "No integrity manifest beside this vault" in " ".join(page.text)
    assert not [t for t in page.titles if re.match(r"layer \d+ expert \d+: gate", t)]
    # --no-manifest: the same, though the demo has one
    proc = run("report", demo, "-o", tmp_path / "none.html", "--no-manifest", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["snr"] is False


def test_a_named_manifest_that_is_missing_is_refused(demo: Path, tmp_path: Path) -> None:
    """``--manifest MISSING`` is an unreadable input (exit 2, one line), not "no manifest":
    no page is written."""
    missing = tmp_path / "missing.json"
    out = tmp_path / "r.html"
    proc = run("report", demo, "-o", out, "--manifest", missing)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"error: {missing}: cannot open: No such file or directory\n"
    proc = run("report", demo, "-o", out, "--manifest", missing, "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["exit_code"] == 2
    proc = run("report", demo, "-o", out, "--manifest", tmp_path)  # a folder: refused too
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert not out.exists()


def test_a_manifest_of_another_vault_is_not_used(demo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.smoe"
    shutil.copyfile(FIXTURES / "q4_v2.smoe", other)
    shutil.copyfile(manifest.path_for(demo), manifest.path_for(other))
    result = write_report(other, tmp_path / "other.html")
    assert not result.snr
    assert "describes another file" in (tmp_path / "other.html").read_text()


def test_every_corrupt_fixture_gets_a_page_with_its_finding(tmp_path: Path) -> None:
    for name in BAD:
        out = tmp_path / f"{name}.html"
        result = write_report(CORRUPT / name, out, deep=True)
        assert not result.ok, name
        page = Page(out.read_text())
        assert page.h2[0] == "Findings", name  # an invalid vault's findings come first
        code, offset = EXPECTED[name]["code"], EXPECTED[name]["offset"]
        assert any(r[:3] == ["error", code, f"{offset:#x}"] for r in page.rows), name
    short = tmp_path / "short.smoe"
    short.write_bytes(b"SMOE")
    proc = run("report", short, "-o", tmp_path / "short.html")
    assert (
        proc.returncode == 2
        and "shorter than the 64-byte header" in (tmp_path / "short.html").read_text()
    )


def tiny_vault(path: Path, layers: int, experts: int, model_type: str = "qwen3_moe") -> Path:
    """A small valid v2 vault whose blobs are holes (zeros)."""
    shapes = ((32, 64), (32, 64), (64, 32))
    plan = make_plan({(lay, e): shapes for lay in range(layers) for e in range(experts)}, 4, 2)
    arch = ArchInfo(
        rope_theta=1e6,
        num_heads=4,
        num_kv_heads=4,
        head_dim=16,
        moe_top_k=2,
        moe_ffn_dim=32,
        num_hidden_layers=layers,
        rms_norm_eps=1e-6,
        model_type=model_type,
    )
    with AtomicFile(path) as f:
        f.pwrite(metadata_bytes(plan, ModelInfo(layers, experts, 64, 128, 32), arch), 0)
        f.truncate(plan.file_size)
        f.commit()
    return path


def test_text_from_the_vault_is_escaped(tmp_path: Path) -> None:
    """A model_type and a file name with markup in them are shown, never interpreted."""
    vault = tiny_vault(tmp_path / "<i>v&.smoe", 1, 2, model_type="<b>x</b>&\"'")
    out = tmp_path / "escaped.html"
    write_report(vault, out)
    html = out.read_text()
    assert "<b>" not in html and "<i>" not in html
    assert "&lt;b&gt;x&lt;/b&gt;&amp;" in html and "&lt;i&gt;v&amp;.smoe" in html


def test_page_is_self_contained(demo: Path, tmp_path: Path) -> None:
    """No script, nothing fetched: the only references are to the page's own ids."""
    out = tmp_path / "page.html"
    write_report(demo, out)
    html = out.read_text()
    page = Page(html)
    assert "script" not in page.tags and "<script" not in html.lower()
    assert not [a for a in page.attrs if a[1].startswith("on")]  # no event handlers
    links = [(tag, v) for tag, k, v in page.attrs if k in ("href", "src", "xlink:href")]
    assert links and all(v.startswith("#") for _, v in links), links
    assert re.findall(r"url\(([^)]*)\)", html) == ["#hatch"] * len(re.findall(r"url\(", html))
    assert "@import" not in html and "http" not in html.replace("http-equiv", "")


# ---- scale -------------------------------------------------------------------------------
def test_qwen3_235b_page_stays_small(big: Path, tmp_path: Path) -> None:
    out = tmp_path / "big.html"
    result = write_report(big, out)
    assert (result.experts, result.layers, result.snr) == (12_032, 94, True)
    assert result.bytes < 600_000, result.bytes  # about 0.3 MB
    page = Page(out.read_text())
    # the heat map is one path per colour, not one element per expert; tooltips per layer
    paths = [v for tag, k, v in page.attrs if tag == "path" and k == "fill"]
    assert len(paths) <= report.SNR_BANDS + 4
    layer_tips = [t for t in page.titles if re.match(r"layer \d+: lowest", t)]
    assert len(layer_tips) == 94
    text = " ".join(page.text)
    assert "below the Q4 floor (10 dB): 5" in text
    assert "exact (all-zero tensors, no finite SNR): 2" in text
    # the map: metadata regions, one blob segment per layer
    blob_tips = [t for t in page.titles if re.match(r"layer \d+ blobs: [\d,]+\.\.", t)]
    assert len(blob_tips) == 2 * 94  # the whole-file bar and the blob strip
    assert page.row("tensor descriptors")[3] == f"{12_032 * 3 * 44:,}"


def test_a_vault_of_very_many_layers_gives_a_bounded_page(tmp_path: Path) -> None:
    """Beyond MAX_ROWS layers the table and heat map stop (and say so); beyond MAX_RUNS
    blob runs the map merges neighbours."""
    n = report.MAX_ROWS + 6
    vault = tiny_vault(tmp_path / "tall.smoe", n, 1)
    synthetic_manifest(vault)
    out = tmp_path / "tall.html"
    result = write_report(vault, out)
    assert (result.ok, result.layers, result.snr) == (True, n, True)
    assert result.bytes < 1_000_000, result.bytes
    page = Page(out.read_text())
    text = " ".join(" ".join(page.text).split())
    assert "and 6 more layers, not listed." in text
    assert "6 experts lie outside the drawn grid" in text
    runs = [
        t
        for t in page.titles
        if re.match(r"(layer \d+ blobs|blobs, several layers): [\d,]+\.\.", t)
    ]
    assert any(t.startswith("blobs, several layers") for t in runs)
    assert len(runs) <= 2 * report.MAX_RUNS


def test_fit_widths_keeps_small_regions_visible() -> None:
    sizes = [64, 577_536, 1_588_224, 128, 13_120] + [1_283_457_024] * 94
    widths = fit_widths(sizes, 1160, 4)
    assert sum(widths) == pytest.approx(1160)
    assert min(widths) == pytest.approx(4)
    assert widths[-1] == pytest.approx(widths[-2]) and widths[-1] > 4
    assert fit_widths([1, 1, 1], 6, 4) == [2.0, 2.0, 2.0]  # too many to honour the minimum


# ---- writing safely ------------------------------------------------------------------------
def test_refuses_an_output_that_is_the_vault_or_its_manifest(demo: Path, tmp_path: Path) -> None:
    side = manifest.path_for(demo)
    before = (demo.read_bytes(), side.read_bytes())
    (tmp_path / "hard").hardlink_to(demo)
    (tmp_path / "soft").symlink_to(side)
    for out in (demo, side, tmp_path / "hard", tmp_path / "soft"):
        with pytest.raises(SmoeError, match="refusing to overwrite an input"):
            write_report(demo, out)
        proc = run("report", demo, "-o", out, "--json")
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1
        assert json.loads(proc.stdout)["error"]["exit_code"] == 1
    with pytest.raises(SmoeError, match="is a folder"):
        write_report(demo, tmp_path)
    assert (demo.read_bytes(), side.read_bytes()) == before


def test_written_atomically_over_an_old_page_or_a_symlink(demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    write_report(demo, out)  # an old page of ours
    target = tmp_path / "target.txt"
    target.write_text("keep")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    write_report(demo, out)
    write_report(demo, link)
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert not link.is_symlink() and link.read_text().startswith("<!DOCTYPE html>")
    assert target.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.html", "r.html", "target.txt"]


def test_cli_json_and_exit_codes(demo: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "r.html"
    proc = run("report", demo, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["report"] == str(out) and doc["vault"] == str(demo)
    assert (doc["schema"], doc["experts"], doc["snr"], doc["ok"]) == (
        "smoe-report/1",
        16,
        True,
        True,
    )
    assert doc["bytes"] == out.stat().st_size
    proc = run("report", demo, "-o", tmp_path / "t.html")
    assert proc.returncode == 0 and proc.stdout.startswith(f"wrote {tmp_path / 't.html'} (")
    bad = run("report", CORRUPT / BAD[0], "-o", tmp_path / "bad.html", "--json")
    assert bad.returncode == 1 and json.loads(bad.stdout)["ok"] is False
    assert (tmp_path / "bad.html").exists()  # an invalid vault still gets its page
    missing = run("report", tmp_path / "missing.smoe", "-o", tmp_path / "m.html")
    assert missing.returncode == 2 and not (tmp_path / "m.html").exists()
    assert run("report", demo).returncode == 2  # -o is required


# ---- in a real browser ---------------------------------------------------------------------
def _chromium() -> str:
    """Debian's chromium; installed with apt-get when missing and running as root."""
    found = shutil.which("chromium")
    if found is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = plain_env(DEBIAN_FRONTEND="noninteractive")
        run("update", command=["apt-get"], env=env)
        run("install", "-y", "chromium", command=["apt-get"], env=env, timeout=2 * HANG_GUARD)
        found = shutil.which("chromium")
    if found is None:
        pytest.skip(
            "the browser test needs Debian's chromium package (apt-get install "
            "chromium), which is missing and cannot be installed here"
        )
    return found


@pytest.fixture(scope="module")
def chromium() -> str:
    return _chromium()


def browse(chromium: str, page: Path, profile: Path, *mode: str) -> subprocess.CompletedProcess:
    """Load ``page`` in headless chromium; console messages are logged on stderr."""
    return run(
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        "--window-size=1400,1800",
        *mode,
        page.resolve().as_uri(),
        command=[chromium],
    )


def console_lines(stderr: str) -> list[str]:
    """What the page wrote to the console (script errors, SVG attribute errors, ...)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def png_pixels(data: bytes) -> np.ndarray:
    """A non-interlaced 8-bit RGB(A) PNG as an array [height, width, channels]."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, ihdr = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
    assert ihdr is not None
    width, height, depth, colour, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0 and colour in (2, 6), ihdr
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(chunks)), np.uint8)
    raw = raw.reshape(height, 1 + width * bpp)
    rows = np.zeros((height, width * bpp), np.uint8)
    prev = np.zeros(width * bpp, np.uint8)
    for y in range(height):
        method, line = int(raw[y, 0]), raw[y, 1:]
        if method == 0:
            row = line.copy()
        elif method == 1:  # Sub: a running sum per channel, modulo 256
            row = np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint8).reshape(-1)
        elif method == 2:  # Up
            row = line + prev
        else:  # Average, Paeth: byte by byte
            row = _unfilter_sequential(line.tolist(), prev.tolist(), bpp, paeth=method == 4)
        rows[y] = prev = row
    return rows.reshape(height, width, bpp)


def _unfilter_sequential(line: list[int], prev: list[int], bpp: int, paeth: bool) -> np.ndarray:
    cur = [0] * len(line)
    for i, x in enumerate(line):
        a = cur[i - bpp] if i >= bpp else 0
        b = prev[i]
        if paeth:
            c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        else:
            pred = (a + b) >> 1
        cur[i] = (x + pred) & 0xFF
    return np.array(cur, np.uint8)


def test_png_reader_decodes_every_filter() -> None:
    """The reader above against an image whose rows use each of the five filters."""
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    bpp, raw = 3, b""
    prev = np.zeros(7 * bpp, np.int64)
    for y in range(5):
        cur = img[y].reshape(-1).astype(np.int64)
        left = np.r_[np.zeros(bpp, np.int64), cur[:-bpp]]
        upleft = np.r_[np.zeros(bpp, np.int64), prev[:-bpp]]
        if y == 3:
            pred = (left + prev) // 2
        elif y == 4:
            p = left + prev - upleft
            pa, pb, pc = abs(p - left), abs(p - prev), abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
        else:
            pred = [np.zeros_like(cur), left, prev][y]
        raw += bytes([y]) + ((cur - pred) % 256).astype(np.uint8).tobytes()
        prev = cur

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 7, 5, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    assert np.array_equal(png_pixels(png), img)


@pytest.fixture(scope="module")
def pages(demo: Path, big: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pages")
    out = {
        "demo": folder / "demo.html",
        "qwen3_235b": folder / "qwen3_235b.html",
        "corrupt": folder / "corrupt.html",
    }
    write_report(demo, out["demo"])
    write_report(big, out["qwen3_235b"])
    write_report(CORRUPT / "blob_beyond_eof.smoe", out["corrupt"])
    return out


@pytest.mark.parametrize("name", ["demo", "qwen3_235b", "corrupt"])
def test_browser_renders_the_page_without_console_errors(
    chromium: str, pages: dict[str, Path], tmp_path: Path, name: str
) -> None:
    page = pages[name]
    shot = tmp_path / "shot.png"
    proc = browse(chromium, page, tmp_path / "profile", f"--screenshot={shot}", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_lines(proc.stderr) == []
    pixels = png_pixels(shot.read_bytes())
    assert pixels.shape[:2] == (1800, 1400)
    rgb = pixels[..., :3].astype(np.uint32)
    packed = (rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2]).reshape(-1)
    colours, counts = np.unique(packed, return_counts=True)
    assert len(colours) > 200  # text, the map's layer colours, the heat map
    assert counts.max() < 0.8 * len(packed)  # not one background colour
    # the DOM the browser built from the file: the sections and drawings are all there
    parsed = Page(proc.stdout)
    assert parsed.h2 == Page(page.read_text()).h2
    assert parsed.tags.count("svg") == Page(page.read_text()).tags.count("svg") >= 1


@pytest.fixture
def broken_page(tmp_path: Path) -> Iterator[Path]:
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><svg><rect width="-3" height="1"/></svg>')
    yield page


def test_browser_check_sees_svg_errors(chromium: str, broken_page: Path, tmp_path: Path) -> None:
    """The console check is not vacuous: an invalid SVG attribute is reported."""
    proc = browse(chromium, broken_page, tmp_path / "profile", "--dump-dom")
    assert any("A negative value is not valid" in line for line in console_lines(proc.stderr))


def test_weighted_snr_is_shown_when_the_manifest_has_it(tmp_path: Path) -> None:
    """An imatrix sculpt records weighted_snr_db: the heat map shows that one and says so."""
    src = FIXTURES / "q4_v2.smoe"
    vault = tmp_path / src.name
    shutil.copy(src, vault)
    doc = json.loads(manifest.path_for(src).read_text())
    for row in doc["experts"]:
        row["tensors"] = [
            {"name": n, "snr_db": 18.0, "weighted_snr_db": 21.5}
            for n in ("gate_proj", "up_proj", "down_proj")
        ]
    manifest.path_for(vault).write_bytes(manifest.encode(doc))
    out = tmp_path / "r.html"
    report.write_report(vault, out)
    page = out.read_text()
    assert "Importance-weighted SNR" in page
    assert "21.50" in page and "18.00" not in page


def test_absurd_snr_values_are_drawn_at_the_end_of_the_scale(demo: Path, tmp_path: Path) -> None:
    """A manifest may record any finite SNR; 1e300 dB (every tensor) gets a page, the values
    drawn and listed at ±SNR_SHOWN, never an internal error (issue 23, case 10)."""
    for p in (demo, manifest.path_for(demo)):
        shutil.copyfile(p, tmp_path / p.name)
    vault = tmp_path / demo.name
    doc = json.loads(manifest.path_for(vault).read_text())
    for row in doc["experts"]:
        for t in row["tensors"]:
            t["snr_db"] = 1e300
    manifest.path_for(vault).write_bytes(manifest.encode(doc))
    out = tmp_path / "page.html"
    write_report(vault, out)
    html = out.read_text()
    assert f"{report.SNR_SHOWN:.1f}" in html or f"{report.SNR_SHOWN:,.1f}" in html
    assert "1e+300" not in html
