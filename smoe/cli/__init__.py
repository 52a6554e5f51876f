"""Command-line entry points: ``smoe <command>`` and ``smoe-dump``.

Every failure is one line on stderr, ``error: MESSAGE``, never a traceback (``--debug`` or
``SMOE_DEBUG=1`` re-raises to show it); a multi-line message is folded onto one line, an
undecodable byte of a path is shown as ``\\xNN``. A refused command line is one line too.

Exit status:

* 0: done (verify/dump: no error finding).
* 1: a :class:`SmoeError` (refused or failed operation; verify/dump: the vault breaks a
  rule); an ``OSError`` (``error: FILE: STRERROR``) naming an output, or of a write-side
  kind (EROFS, ENOSPC, EDQUOT, EEXIST, ...) whatever file it names; stdout that cannot be
  written (``error: standard output: cannot write: ...``); any other exception
  (``UnicodeError``, ``ValueError``, ``MemoryError``, ...): ``error: internal error: TYPE:
  message (run with --debug for the traceback)``.
* 2: an input cannot be read at all: ``fileio.NotRegular`` (a FIFO, folder or device, or a
  file that cannot be opened), a vault too short for a header, and an
  ``OSError`` of a read-side kind (ENOENT, EACCES, EPERM, EISDIR, ENOTDIR, ELOOP, EIO, ...)
  naming an input (vault, ``--manifest``, ``--config``, ``--model`` or the model folder, or
  a file inside one) that is not under an output; also a refused command line (``--jobs 0``).
* 130: interrupted (Ctrl-C); 141: stdout was closed (``| head``), quietly.

With ``--json`` stdout holds exactly one RFC 8259 document, on success (the command's own
shape; verify and dump: docs/JSON.md) and on failure: ``{"schema": "smoe-findings/1", "ok":
false, "error": {"message": MESSAGE, "exit_code": N}}`` (the stderr line is printed too).
:func:`to_json` serialises every document: non-finite floats become ``null``, undecodable
bytes in strings U+FFFD.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn, TextIO, cast

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from smoe import __version__
from smoe.errors import SmoeError
from smoe.format import findings
from smoe.plumbing.cpus import usable_cores
from smoe.plumbing.fileio import NotRegular
from smoe_gen import layout

if TYPE_CHECKING:
    from smoe.format.verify import Report

__all__ = ["dump_main", "main"]


def _spec_summary() -> dict:
    structs = {}
    for st in layout.STRUCTS:
        structs[st.name] = {
            "size": st.dtype.itemsize,
            "fields": [
                {
                    "name": f,
                    "offset": st.offsets[f],
                    "size": st.dtype[f].itemsize,
                    "doc": st.docs[f],
                }
                for f in st.dtype.names or ()  # a struct's dtype: names is set
            ],
        }
    return {
        "magic": layout.MAGIC.hex(" "),
        "arch_magic": layout.ARCH_MAGIC.hex(" "),
        "versions": [layout.VERSION_MIN, layout.VERSION_MAX],
        "page_size": layout.PAGE_SIZE,
        "group_size": layout.GROUP_SIZE,
        "supported_bits": list(layout.SUPPORTED_BITS),
        "structs": structs,
    }


# ---- output helpers ------------------------------------------------------------------------
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_NEWLINES = re.compile(r"\s*[\r\n]+\s*")


def _text(s: str) -> str:
    """``s`` as valid Unicode: every lone surrogate (an undecodable byte of a path) -> U+FFFD."""
    return s if s.isascii() else _SURROGATE.sub("\ufffd", s)


def _jsonable(obj: object) -> object:
    """``obj`` as plain JSON data: non-finite floats -> None, strings valid UTF-8 (lone
    surrogates -> U+FFFD), numpy scalars and arrays -> Python values, paths -> text, tuples ->
    lists, anything else -> its ``str``."""
    if obj is None or isinstance(obj, bool):
        return obj
    if isinstance(obj, str):
        return _text(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {_json_key(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, os.PathLike):
        return _text(os.fsdecode(obj))
    return _text(str(obj))


def _json_key(k: object) -> str:
    return _text(k) if isinstance(k, str) else _text(to_json(k, indent=None))


def to_json(obj: object, indent: int | None = 2) -> str:
    """One RFC 8259 document (ASCII, no NaN or Infinity): the only serialiser of the CLI."""
    return json.dumps(_jsonable(obj), indent=indent, allow_nan=False)


def _print_json(obj: object) -> None:
    print(to_json(obj))


def _shown(s: object) -> str:
    """A path or message for the terminal: one line, an undecodable byte as ``\\xNN``, other
    control characters escaped (no terminal escape sequence gets through)."""
    text = _NEWLINES.sub(" ", os.fsdecode(s) if isinstance(s, os.PathLike) else str(s)).strip()
    text = _SURROGATE.sub(lambda m: _escape_surrogate(m.group()), text)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _escape_surrogate(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def _one_line(message: str) -> str:
    """A message folded onto one line (for JSON: the terminal form escapes more)."""
    return _text(_NEWLINES.sub(" ", message).strip())


# ---- consoles: rich on a terminal, plain lines in a pipe ------------------------------------
_PIPE_WIDTH = 1 << 20  # the width of a pipe or file: wide enough that nothing wraps or is cut


class _TrimmedLines:
    """A text stream that drops the spaces at the end of every line (rich pads table cells
    to their column's width). Spaces are held back until text follows them on the line."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._spaces = ""

    def write(self, text: str) -> int:
        *ended, last = text.split("\n")
        out = [(self._spaces + line).rstrip(" ") + "\n" for line in ended]
        if ended:
            self._spaces = ""
        body = self._spaces + last
        kept = body.rstrip(" ")
        self._spaces = body[len(kept) :]
        self._stream.write("".join(out) + kept)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def _make_console(stderr: bool = False, highlight: bool = False) -> Console:
    """The Console of stdout (or stderr). On a terminal: rich's rendering at the terminal's
    width (``COLUMNS``), in colour unless ``NO_COLOR`` is set. Anywhere else (a pipe, a file):
    plain text, no colour, never wrapped or cut whatever ``COLUMNS`` says, and no spaces at
    line ends, so that every line greps as a whole (a long path stays on one line)."""
    stream = sys.stderr if stderr else sys.stdout
    if _is_terminal(stream):
        return Console(stderr=stderr, highlight=highlight)
    return Console(
        # rich only writes, flushes and reads attributes, which _TrimmedLines forwards
        file=cast(IO[str], _TrimmedLines(stream)),
        width=_PIPE_WIDTH,
        soft_wrap=True,
        highlight=False,
        force_terminal=False,
        no_color=True,
    )


def _table(console: Console, title: str, show_header: bool = True) -> Table:
    """A table for ``console``: boxed on a terminal, plain aligned columns (no borders, no
    indent) in a pipe, where a box around an unbounded column would pad every line."""
    if console.is_terminal:
        return Table(title=title, title_justify="left", show_header=show_header)
    return Table(
        title=title, title_justify="left", show_header=show_header, box=None, pad_edge=False
    )


def _warn(warnings: Sequence[str]) -> None:
    """Each warning as one line on stderr: stdout holds only the command's output."""
    err = _make_console(stderr=True)
    for w in warnings:
        err.print(f"[yellow]warning:[/] {escape(_shown(w))}", soft_wrap=True)


def cmd_spec(args: argparse.Namespace) -> int:
    """Print the format's constants and struct layouts (from the generated layout), or with
    ``--ksy`` the Kaitai Struct spec itself (shipped in the package)."""
    if args.ksy:
        from importlib.resources import files

        sys.stdout.write(files("smoe_gen").joinpath("smoe.ksy").read_text(encoding="utf-8"))
        return 0
    summary = _spec_summary()
    if args.json:
        _print_json(summary)
        return 0
    console = _make_console(highlight=True)
    console.print(
        f"[bold].smoe format[/] v{summary['versions'][0]}..v{summary['versions'][1]}  "
        f"magic [cyan]{summary['magic']}[/]  page {summary['page_size']} B  "
        f"group {summary['group_size']}  bits {summary['supported_bits']}"
    )
    for name, info in summary["structs"].items():
        table = _table(console, f"{name} ({info['size']} bytes)")
        table.add_column("offset", justify="right")
        table.add_column("size", justify="right")
        table.add_column("field")
        table.add_column("meaning", overflow="fold")
        for f in info["fields"]:
            table.add_row(str(f["offset"]), str(f["size"]), escape(f["name"]), escape(f["doc"]))
        console.print(table)
    return 0


def cmd_sculpt(args: argparse.Namespace) -> int:
    """Convert a HuggingFace MoE checkpoint (a folder or a model id) into a vault and a scout."""
    from smoe.sculpt import SculptOptions, SculptResult, sculpt
    from smoe.sculpt.source.hub import resolve

    # the local folder from here on: an OSError inside it is an unreadable input (exit 2)
    args.model_dir, stem = resolve(args.model_dir, args.revision)
    opts = SculptOptions(
        bits=args.bits,
        version=args.format_version,
        max_layers=args.max_layers,
        max_experts=args.max_experts,
        jobs=args.jobs,
        resume=args.resume,
        dry_run=args.dry_run,
        scale=args.scale,
        name=args.name if args.name is not None else stem,
        imatrix=args.imatrix,
    )
    err = _make_console(stderr=True)
    if args.dry_run:
        plan = sculpt(args.model_dir, args.out_dir, opts)
        assert isinstance(plan, dict)  # with dry_run: the planned layout
        if args.json:
            _print_json(plan)
        else:
            _show_dry_run(plan)
        return 0
    columns = (
        TextColumn("[bold]sculpt[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("experts"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(
        *columns, console=err, transient=True, disable=args.json or not err.is_terminal
    ) as bar:
        task = bar.add_task("sculpt", total=None, rate="")
        start = time.perf_counter()

        def progress(done: int, total: int, bytes_in: int) -> None:
            rate = bytes_in / 1e6 / max(time.perf_counter() - start, 1e-9)
            bar.update(task, completed=done, total=total, rate=f"{rate:7.1f} MB/s")

        result = sculpt(args.model_dir, args.out_dir, opts, progress=progress)
    assert isinstance(result, SculptResult)  # without dry_run: what was written
    summary = result.summary()
    if args.json:
        _print_json(summary)
    else:
        _show_summary(summary)
    return 0


def _output_stem(text: str) -> str:
    """argparse type: a stem for the outputs (``sculpt --name``)."""
    from smoe.sculpt.source.hub import check_stem

    try:
        return check_stem(text)
    except SmoeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _show_dry_run(plan: dict) -> None:
    c = _make_console(highlight=True)
    t = _table(c, "planned vault (nothing written)", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("experts", str(plan["experts"]))
    t.add_row(
        "experts per layer", ", ".join(f"{k}: {v}" for k, v in plan["experts_per_layer"].items())
    )
    t.add_row("blob raw / padded bytes", f"{plan['blob_raw_sizes']} / {plan['blob_padded_sizes']}")
    t.add_row("data_offset", f"{plan['data_offset']:#x} ({plan['data_offset']})")
    t.add_row("arch block at", str(plan["reserved_ext"]) if plan["arch"] else "none (v1)")
    t.add_row("vault size", f"{plan['vault_bytes']:,} bytes")
    t.add_row("scout size", f"{plan['scout_bytes']:,} bytes ({plan['scout_tensors']} tensors)")
    c.print(t)
    if plan["arch"]:
        a = _table(c, "arch block", show_header=False)
        for k, v in plan["arch"].items():
            a.add_row(k, str(v))
        c.print(a)
    _warn(plan["warnings"])


def _show_summary(s: dict) -> None:
    c = _make_console(highlight=True)
    t = _table(c, "sculpt summary", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("vault", escape(_shown(s["vault"])))
    t.add_row("scout", escape(_shown(s["scout"])))
    if s.get("config"):
        t.add_row("config", escape(_shown(s["config"])))
    t.add_row("experts written", f"{s['experts_written']} (+{s['experts_resumed']} resumed)")
    t.add_row("expert bytes in", f"{s['expert_bytes_in']:,}")
    t.add_row("vault / scout bytes", f"{s['vault_bytes']:,} / {s['scout_bytes']:,}")
    if s["compression_ratio"]:
        t.add_row("compression", f"{s['compression_ratio']:.2f}x")
    phases = s.get("phases_s")
    split = " (" + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()) + ")" if phases else ""
    t.add_row("time", f"{s['seconds']:.2f} s{split}")
    if s["throughput_mb_s"]:
        t.add_row("throughput", f"{s['throughput_mb_s']:.1f} MB/s of expert weights")
    im = s.get("imatrix")
    if im:
        data = ", ".join(im["datasets"]) or "an unnamed dataset"  # (text from the file)
        t.add_row("imatrix", escape(_shown(f"{im['path']} ({im['chunk_count']} chunks of {data})")))
    c.print(t)
    weighted = s.get("weighted_snr_db")
    q = _table(c, "quantisation SNR (dB)")
    q.add_column("tensor")
    q.add_column("min over experts", justify="right")
    q.add_column("median", justify="right")
    if weighted is not None:
        q.add_column("imatrix-weighted min", justify="right")
        q.add_column("median", justify="right")

    def cells(v: dict | None) -> tuple[str, str]:
        return ("-", "-") if v is None else (f"{v['min']:.2f}", f"{v['median']:.2f}")

    for name, v in s["snr_db"].items():
        q.add_row(name, *cells(v), *(cells(weighted.get(name)) if weighted is not None else ()))
    c.print(q)
    _warn(s["warnings"])


def _manifest(args: argparse.Namespace) -> str | Path | None:
    """``verify_path``'s ``manifest=``: "auto" (beside the vault), a given file, or None."""
    if args.no_manifest:
        return None
    return "auto" if args.manifest is None else args.manifest


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every rule; exit 0 = no errors, 1 = errors, 2 = unreadable."""
    from smoe.format.verify import verify_path

    report = verify_path(args.vault, deep=args.deep, manifest=_manifest(args))
    if args.json:
        doc = findings.document(str(args.vault), report.size, args.deep, report.findings)
        _print_json(doc)
    else:
        c = _make_console()
        for f in report.findings:
            style = {"error": "bold red", "warning": "yellow", "info": "cyan"}[f.severity]
            c.print(f"[{style}]{escape(_shown(f.line()))}[/]", soft_wrap=True)
        n_err, n_warn = len(report.errors), sum(f.severity == "warning" for f in report.findings)
        verdict = "[bold green]valid[/]" if report.ok else "[bold red]INVALID[/]"
        c.print(
            f"{escape(_shown(args.vault))}: {verdict} ({n_err} errors, {n_warn} warnings"
            f"{', deep' if args.deep else ''})",
            soft_wrap=True,
        )
    return _verdict(report)


def _verdict(report: Report) -> int:
    """The exit status of a judged vault: 0 valid, 1 a rule broken, 2 unreadable (shorter
    than a header: ``header.size``)."""
    if any(f.code == layout.Rule.HEADER_SIZE.code for f in report.errors):
        return 2
    return 0 if report.ok else 1


def cmd_dump(args: argparse.Namespace) -> int:
    """Show a vault: summary, header, arch block, table by layer, findings."""
    from smoe.cli.dump import collect_path, render

    dump, report = collect_path(args.vault, deep=args.deep, manifest=_manifest(args))
    if args.json:
        keys = ("file", "header", "arch", "experts", "findings")
        _print_json({"schema": findings.SCHEMA, **{k: dump[k] for k in keys}})
    else:
        render(dump, _make_console(), experts=args.experts, layer=args.layer)
    return _verdict(report)


def cmd_export(args: argparse.Namespace) -> int:
    """Dequantise experts to float32 safetensors, or (--hf) a whole HF checkpoint folder."""
    if args.hf:
        return _export_hf(args)
    for flag in ("scout", "config", "dtype", "max_shard_size"):
        if getattr(args, flag) is not None:
            return _fail(args, f"--{flag.replace('_', '-')} needs --hf (see smoe export --help)", 2)
    from smoe.export.float32 import export

    names = export(args.vault, args.out, layer=args.layer, expert=args.expert)
    if args.json:
        _print_json({"out": str(args.out), "tensors": names})
    else:
        _make_console().print(
            f"wrote {len(names)} float32 tensors "
            f"({len(names) // 3} experts) to "
            f"{escape(_shown(args.out))}",
            soft_wrap=True,
        )
    return 0


def _export_hf(args: argparse.Namespace) -> int:
    """``smoe export VAULT OUT_DIR --hf``: see :mod:`smoe.export.hf.checkpoint`."""
    from smoe.export.hf.checkpoint import MAX_SHARD_SIZE, export_hf

    if args.layer is not None or args.expert is not None:
        return _fail(
            args,
            "--layer/--expert select experts of a float32 export; --hf writes "
            "the whole model (see smoe export --help)",
            2,
        )
    result = export_hf(
        args.vault,
        args.out,
        scout=args.scout,
        config=args.config,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size or MAX_SHARD_SIZE,
    )
    summary = result.summary()
    if args.json:
        _print_json(summary)
        return 0
    _warn_notes(summary["notes"])
    _make_console().print(
        f"wrote {escape(_shown(args.out))}: {len(summary['files'])} files, "
        f"{summary['tensors']} tensors ({summary['expert_tensors']} expert tensors in "
        f"{summary['dtype']}), {summary['bytes_out'] / 1e6:,.1f} MB; config.json "
        f"{escape(_shown(summary['config']))}",
        soft_wrap=True,
    )
    return 0


def _warn_notes(notes: Sequence[str]) -> None:
    """Each note as one line on stderr (``note: ...``)."""
    err = _make_console(stderr=True)
    for n in notes:
        err.print(f"[cyan]note:[/] {escape(_shown(n))}", soft_wrap=True)


def _shard_size(text: str) -> int:
    """``--max-shard-size``: bytes, or with a unit as save_pretrained takes it (5GB, 500MB)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 5GB, 500MB, 1000000)")
    unit = (m.group(2) or "").upper()
    scale = {
        "": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
    }[unit]
    value = int(m.group(1)) * scale
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1 byte")
    return value


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Upgrade a v1 vault to v2 (D7): in place when there is room, else --out NEW."""
    from smoe.families.config import arch_from_config, load_config
    from smoe.sculpt.source.checkpoint import Checkpoint
    from smoe.vault.reader import Vault
    from smoe.vault.upgrade import upgrade

    vault = Vault.open(args.vault)
    if args.model is not None:
        ckpt = Checkpoint.open(args.model)
        arch, warnings = ckpt.arch_info(), ckpt.warnings
    else:
        rows = int(vault.descriptors[0, 0]["rows"]) if len(vault) else 0
        arch, warnings = arch_from_config(load_config(args.config), str(args.config), rows)
    del vault
    result = upgrade(
        args.vault, arch, force=args.force, out=args.out, inputs=[args.config or args.model]
    )
    info = {
        "path": str(result.path),
        "mode": result.mode,
        "arch_offset": result.arch_offset,
        "data_offset": result.data_offset,
        "warnings": warnings,
    }
    if args.json:
        _print_json(info)
    else:
        c = _make_console()
        verb = {
            "in-place": "upgraded in place to v2",
            "re-stamp": "re-stamped the arch block of",
            "rewrite": "wrote a v2 copy",
        }[result.mode]
        c.print(
            f"{verb}: {escape(_shown(result.path))} (arch block at {result.arch_offset}, "
            f"data_offset {result.data_offset})",
            soft_wrap=True,
        )
        _warn(warnings)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write one self-contained HTML page picturing a vault; exit status as ``smoe dump``."""
    from smoe.cli.report import write_report

    result = write_report(args.vault, args.out, deep=args.deep, manifest=_manifest(args))
    if args.json:
        _print_json(result.to_dict())
    else:
        snr = f"SNR from {_shown(result.manifest)}" if result.snr else "no SNR (no manifest)"
        errors = f"{result.errors} error{'' if result.errors == 1 else 's'}"
        verdict = "valid" if result.ok else f"INVALID ({errors})"
        _make_console().print(
            f"wrote {escape(_shown(result.path))} ({result.bytes:,} bytes): "
            f"{result.experts:,} experts in {result.layers} layers, {escape(snr)}; {verdict}",
            soft_wrap=True,
        )
    return 2 if result.unreadable else (0 if result.ok else 1)


# ---- command line --------------------------------------------------------------------------
class _UsageError(Exception):
    """A command line argparse refuses (exit status 2, one line like every other failure)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a refused command line is one ``error:`` line, not usage + message."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see {self.prog} --help)")


def _positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (``--jobs``)."""
    try:
        n = int(text, 10)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def _debug_flag(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: a subcommand's parser must not reset a --debug given before the command
    p.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the Python traceback of a failure (also SMOE_DEBUG=1)",
    )


def _version_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def _build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="smoe", description=__doc__.split("\n\n")[0])
    _version_flag(ap)
    _debug_flag(ap)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("spec", help="show the format's constants and struct layouts")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="machine-readable output")
    form.add_argument("--ksy", action="store_true", help="print the Kaitai Struct spec (.ksy)")
    p.set_defaults(func=cmd_spec)

    p = sub.add_parser("sculpt", help="convert a HuggingFace MoE checkpoint into a vault + scout")
    p.add_argument(
        "model_dir",
        metavar="model",
        help="checkpoint folder (config.json, "
        "*.safetensors) or HuggingFace model id ORG/NAME (needs smoe[hub]; an "
        "existing folder of that name wins)",
    )
    p.add_argument(
        "out_dir",
        type=Path,
        help="where <stem>.smoe, .scout.safetensors, .smoe.manifest.json and .config.json go",
    )
    p.add_argument(
        "--name",
        type=_output_stem,
        metavar="STEM",
        help="the outputs' stem (default: the model's name, NAME of ORG/NAME, or the folder's)",
    )
    p.add_argument(
        "--revision",
        metavar="REV",
        help="with a model id: the branch, tag or commit to use (default: main)",
    )
    p.add_argument("--bits", type=int, choices=layout.SUPPORTED_BITS, default=layout.BITS_Q4)
    p.add_argument(
        "--format-version",
        type=int,
        default=layout.VERSION_MAX,
        choices=range(layout.VERSION_MIN, layout.VERSION_MAX + 1),
    )
    p.add_argument("--max-layers", type=int, help="only the first N MoE layers (partial vault)")
    p.add_argument("--max-experts", type=int, help="only the first N experts of each layer")
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"worker processes, at least 1 (default: the usable cores, "
        f"{usable_cores()} here; never more than there are batches of experts)",
    )
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--dry-run", action="store_true", help="print the planned layout, write nothing")
    p.add_argument(
        "--scale",
        choices=("optimal", "absmax"),
        default="optimal",
        help="how each group's scale is chosen (absmax = the reference Sculptor)",
    )
    p.add_argument(
        "--imatrix",
        type=Path,
        metavar="FILE",
        help="a llama.cpp importance "
        "matrix of this model (llama-imatrix's GGUF or legacy .dat; needs "
        "smoe[imatrix]): each group's scale minimises the error weighted by its "
        "input channels' mean squares, the error of the expert's output",
    )
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    p.set_defaults(func=cmd_sculpt)

    p = sub.add_parser("verify", help="check every rule of the format")
    p.add_argument("vault", type=Path)
    p.add_argument(
        "--deep",
        action="store_true",
        help="also read every blob (linear in size) and check the manifest",
    )
    _manifest_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable findings")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("dump", help="show a vault as a tree (same as smoe-dump)")
    _dump_args(p)

    p = sub.add_parser(
        "export",
        help="dequantise experts to float32 safetensors, or (--hf) "
        "a runnable HuggingFace checkpoint folder",
    )
    p.add_argument("vault", type=Path)
    p.add_argument(
        "out",
        type=Path,
        help="output .safetensors file (with --hf: the checkpoint folder, new or empty)",
    )
    p.add_argument("--layer", type=int, help="only this layer")
    p.add_argument("--expert", type=int, help="only this expert id")
    p.add_argument(
        "--hf",
        action="store_true",
        help="write a whole checkpoint that "
        "transformers loads: scout tensors, dequantised experts, config.json",
    )
    p.add_argument(
        "--scout",
        type=Path,
        help="with --hf: the scout (default: STEM.scout.safetensors beside the vault)",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="with --hf: the config.json to write (default: "
        "STEM.config.json beside the vault, else rebuilt from the arch block)",
    )
    p.add_argument(
        "--dtype",
        choices=("bf16", "f16", "f32"),
        help="with --hf: the experts' dtype (default: the source's, else the scout's, else bf16)",
    )
    p.add_argument(
        "--max-shard-size",
        type=_shard_size,
        metavar="SIZE",
        help="with --hf: "
        "bytes per shard (default 5GB); more than one shard adds "
        "model.safetensors.index.json",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("upgrade", help="upgrade a v1 vault to v2 (arch block)")
    p.add_argument("vault", type=Path)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path, help="the model's config.json")
    src.add_argument("--model", type=Path, help="the model directory (tensor shapes win)")
    p.add_argument("--force", action="store_true", help="re-stamp the arch block of a v2 vault")
    p.add_argument("--out", type=Path, help="write a v2 copy here instead of editing in place")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_upgrade)

    p = sub.add_parser("report", help="write an HTML page picturing a vault (map, fields, SNR)")
    p.add_argument("vault", type=Path)
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        required=True,
        metavar="HTML",
        help="the page to write (replaced atomically; never the vault or manifest)",
    )
    p.add_argument(
        "--deep", action="store_true", help="also read every blob and check it against the manifest"
    )
    m = p.add_mutually_exclusive_group()
    m.add_argument(
        "--manifest",
        type=Path,
        metavar="PATH",
        help="the manifest to take SNR from (default: VAULT.manifest.json)",
    )
    m.add_argument("--no-manifest", action="store_true", help="show no SNR, check no manifest")
    p.add_argument("--json", action="store_true", help='print {"report": PATH, ...}')
    p.set_defaults(func=cmd_report)
    for p in sub.choices.values():
        _debug_flag(p)
    return ap


def _manifest_args(p: argparse.ArgumentParser) -> None:
    m = p.add_mutually_exclusive_group()
    m.add_argument(
        "--manifest",
        type=Path,
        metavar="PATH",
        help="check the blobs against this manifest (default: VAULT.manifest.json "
        "when present); only checked with --deep",
    )
    m.add_argument(
        "--no-manifest",
        action="store_true",
        help="do not check the manifest (it is only checked with --deep anyway)",
    )


def _dump_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("vault", type=Path)
    p.add_argument("--experts", action="store_true", help="list every expert and its tensors")
    p.add_argument("--layer", type=int, help="expand one layer")
    p.add_argument("--deep", action="store_true", help="verify blob contents too, and the manifest")
    _manifest_args(p)
    p.add_argument("--json", action="store_true", help="the same content as JSON")
    p.set_defaults(func=cmd_dump)


# ---- failures ------------------------------------------------------------------------------
_INPUTS = ("vault", "manifest", "config", "model", "model_dir", "scout")  # args naming files read
_OUTPUTS = ("out", "out_dir")  # args naming files written
_READ_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EACCES,
        errno.EPERM,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.EIO,
        errno.ENXIO,
        errno.ENODEV,
    }
)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _paths(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    values = (getattr(args, n, None) for n in names)
    return [os.path.abspath(v) for v in values if isinstance(v, (str, os.PathLike))]


def _os_error(e: OSError, args: argparse.Namespace) -> tuple[str, int]:
    """``FILE: STRERROR`` and the exit status (2: an input cannot be read)."""
    why = e.strerror or str(e) or type(e).__name__
    if e.filename is None:
        return f"I/O error: {why} (run with --debug for the traceback)", 1
    name = os.fsdecode(e.filename)
    where = name if e.filename2 is None else f"{name} -> {os.fsdecode(e.filename2)}"
    full = os.path.abspath(name)
    is_input = (
        e.errno in _READ_ERRNOS
        and _under(full, _paths(args, _INPUTS))
        and not _under(full, _paths(args, _OUTPUTS))
    )
    return f"{where}: {why}", 2 if is_input else 1


def _describe(e: BaseException, args: argparse.Namespace) -> tuple[str, int]:
    """The one-line message (without ``error:``) and exit status for a failure."""
    if isinstance(e, NotRegular):
        return str(e), 2
    if isinstance(e, SmoeError):
        return str(e), 1
    if isinstance(e, OSError):
        return _os_error(e, args)
    detail = _NEWLINES.sub(" ", str(e)).strip()
    return (
        f"internal error: {type(e).__name__}{': ' + detail if detail else ''} "
        "(run with --debug for the traceback)"
    ), 1


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    """Print the one stderr line (and with --json the error document); return ``code``."""
    line = Text.assemble(("error:", "bold red"), " " + _shown(message))
    with contextlib.suppress(OSError):
        _make_console(stderr=True).print(line, soft_wrap=True)
    if getattr(args, "json", False):
        _print_error_json(message, code)
    return code


def _print_error_json(message: str, code: int) -> None:
    """The --json document of a failure (silently dropped if stdout cannot take it)."""
    doc = findings.error_document(_one_line(message), code)
    try:
        _print_json(doc)
        sys.stdout.flush()
    except (OSError, SmoeError):  # SmoeError: _Stdout's disk full
        _silence_stdout()


class _Stdout:
    """``sys.stdout`` while a command runs: a failed write (disk full, I/O error) is one
    SmoeError naming standard output, and stdout then goes to /dev/null so that the flush
    at exit cannot fail again. A closed pipe still raises BrokenPipeError."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as e:
            self._failed(e)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            self._failed(e)

    def _failed(self, e: OSError) -> NoReturn:
        _silence_stdout()
        raise SmoeError(f"standard output: cannot write: {e.strerror or e}") from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _silence_stdout() -> None:
    """Point stdout at /dev/null: nothing more can reach it, and the exit flush succeeds."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):
        pass


def _debug(args: argparse.Namespace) -> bool:
    env = os.environ.get("SMOE_DEBUG", "")
    return bool(getattr(args, "debug", False)) or env not in ("", "0")


def _run(args: argparse.Namespace) -> int:
    try:
        code = args.func(args)
        sys.stdout.flush()  # a full disk under a redirected stdout fails here, not at exit
        return code
    except KeyboardInterrupt:
        hint = (
            "; run the same command with --resume to continue"
            if getattr(args, "func", None) is cmd_sculpt
            else ""
        )
        _make_console(stderr=True).print(f"interrupted{hint}", highlight=False)
        if getattr(args, "json", False):
            _print_error_json(f"interrupted{hint}", 130)
        return 130
    except BrokenPipeError:  # e.g. `smoe-dump --json VAULT | head`: stop quietly
        _silence_stdout()
        return 141
    except Exception as e:
        message, code = _describe(e, args)
        if not _debug(args):
            return _fail(args, message, code)
        if getattr(args, "json", False):
            _print_error_json(message, code)
        raise


def _main(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    for stream in (sys.stdout, sys.stderr):  # a path's undecodable bytes never crash output
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    stdout, sys.stdout = sys.stdout, _Stdout(sys.stdout)
    try:
        try:
            args = parser.parse_args(argv)
        except _UsageError as e:
            words = argv[: argv.index("--")] if "--" in argv else argv
            return _fail(argparse.Namespace(json="--json" in words), str(e), 2)
        return _run(args)
    finally:
        sys.stdout = stdout


def dump_main(argv: list[str] | None = None) -> int:
    """``smoe-dump VAULT [--experts] [--layer L] [--deep] [--json]``: the console script,
    same as ``smoe dump``; returns the exit status (``argv`` default: ``sys.argv[1:]``).

    >>> dump_main(["fixtures/q4_v1.smoe"])
    fixtures/q4_v1.smoe  147,456 bytes  v1  Q4  group 64  data_offset 0x4000  full vault, 8 experts
    ├── header (64 bytes at 0)
    ...
    ├── arch block: none (version 1)
    ├── expert table (8 entries, 2 layers)
    ...
    └── findings (0)
    0
    """
    ap = _Parser(prog="smoe-dump", description=cmd_dump.__doc__)
    _dump_args(ap)
    _version_flag(ap)
    _debug_flag(ap)
    return _main(ap, argv)


def main(argv: list[str] | None = None) -> int:
    """``smoe COMMAND ...``: the console script; returns the exit status (see the module
    docstring; ``argv`` default: ``sys.argv[1:]``).

    >>> main(["verify", "fixtures/q4_v1.smoe"])
    fixtures/q4_v1.smoe: valid (0 errors, 0 warnings)
    0
    >>> import contextlib, io, json
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:
    ...     code = main(["verify", "fixtures/corrupt/bad_magic.smoe", "--json"])
    >>> code, json.loads(out.getvalue())["findings"][0]["code"]
    (1, 'header.magic')
    """
    return _main(_build_parser(), argv)
