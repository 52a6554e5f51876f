"""The command lines of ``smoe`` and ``smoe-dump``: one ``_add_<command>`` per subcommand.

A refused command line is :class:`~smoe.errors.UsageError` (one ``error:`` line, exit 2),
never argparse's usage block. Each subcommand's ``func`` is its ``cmd_<command>`` in
:mod:`smoe.cli.commands`, looked up when the parser is built.
"""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeAlias

from smoe import __version__
from smoe.cli import commands
from smoe.errors import SmoeError, UsageError
from smoe.plumbing.cpus import usable_cores
from smoe_gen import layout

__all__ = ["build_dump_parser", "build_parser"]

# what add_subparsers returns (argparse names it privately; not subscriptable at run time)
_Subparsers: TypeAlias = "argparse._SubParsersAction[_Parser]"


class _Parser(argparse.ArgumentParser):
    """argparse, but a refused command line is one ``error:`` line, not usage + message."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser(description: str = "") -> argparse.ArgumentParser:
    """The parser of ``smoe COMMAND ...`` (``description``: the first lines of ``--help``).

    >>> args = build_parser().parse_args(["verify", "v.smoe", "--deep"])
    >>> args.command, args.vault, args.deep, args.func.__name__
    ('verify', PosixPath('v.smoe'), True, 'cmd_verify')
    >>> try:
    ...     build_parser().parse_args(["sculpt", "m", "o", "--jobs", "0"])
    ... except UsageError as e:
    ...     print(e)
    argument --jobs: expected a whole number >= 1, got '0' (see smoe sculpt --help)
    """
    ap = _Parser(prog="smoe", description=description)
    _version_flag(ap)
    _debug_flag(ap)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_spec,
        _add_families,
        _add_sculpt,
        _add_verify,
        _add_dump,
        _add_export,
        _add_upgrade,
        _add_report,
        _add_meta,
        _add_warmup,
    ):
        add(sub)
    _add_completion(sub, ap)
    for name, p in sub.choices.items():
        _debug_flag(p)
        _describe(p, name)
    return ap


ABOUT: dict[str, tuple[str, tuple[str, ...]]] = {
    "spec": (
        "Print the format's constants and struct layouts as the generated code has them "
        "(spec/smoe.ksy is the source of truth).",
        ("smoe spec", "smoe spec --json", "smoe spec --ksy > smoe.ksy"),
    ),
    "families": (
        "List the MoE model families smoe sculpt converts, and those it refuses with the "
        "reason; with MODEL_TYPE, one family in full.",
        ("smoe families", "smoe families qwen3_moe", "smoe families --json"),
    ),
    "sculpt": (
        "Convert a HuggingFace MoE checkpoint (a folder, or a model id with smoe[hub]) into "
        "a vault of 2- or 4-bit experts, plus its scout (the weights outside the experts), "
        "its integrity manifest and a copy of config.json. Writes are atomic; an interrupted "
        "run continues with --resume.",
        (
            "smoe sculpt ./Qwen3-30B-A3B out/",
            "smoe sculpt Qwen/Qwen3-30B-A3B out/ --bits 2 --calibrate calib.txt",
            "smoe sculpt ./model out/ --dry-run --json",
        ),
    ),
    "verify": (
        "Check every rule of the format (docs/FORMAT.md); with --deep also every blob "
        "against the manifest's checksums. Exit 0 valid, 1 a rule broken, 2 unreadable.",
        ("smoe verify out/model.smoe", "smoe verify out/model.smoe --deep --json"),
    ),
    "export": (
        "Dequantise a vault's experts: to one float32 .safetensors file, or (--hf) back "
        "into a whole checkpoint folder transformers loads (scout tensors, experts, config).",
        (
            "smoe export out/model.smoe experts.safetensors --layer 0",
            "smoe export out/model.smoe hf/ --hf --dtype bf16",
        ),
    ),
    "upgrade": (
        "Give a v1 vault the v2 arch block, from the model's config.json or folder: in "
        "place (one page-aligned write) or as a copy (--out).",
        (
            "smoe upgrade old.smoe --model ./Qwen3-30B-A3B",
            "smoe upgrade old.smoe --config config.json --out new.smoe",
        ),
    ),
    "report": (
        "Write one self-contained HTML page (inline SVG, no script) picturing a vault: its "
        "file map, fields, per-layer sizes and costs, findings and the manifest's SNR.",
        (
            "smoe report out/model.smoe -o report.html",
            "smoe report out/model.smoe -o r.html --deep",
        ),
    ),
    "meta": (
        "Show a vault's free-form metadata (name, description, license, ...), or edit it in "
        "the manifest atomically; the blobs and their checksums are untouched.",
        (
            "smoe meta out/model.smoe",
            "smoe meta out/model.smoe --set license=Apache-2.0 --unset description",
        ),
    ),
    "completion": (
        "Print a completion script for bash, zsh or fish, generated from this command "
        "line's own parser (its commands, options and choices); nothing is written.",
        (
            "source <(smoe completion bash)    # in ~/.bashrc",
            "source <(smoe completion zsh)     # in ~/.zshrc, after compinit",
            "smoe completion fish > ~/.config/fish/completions/smoe.fish",
        ),
    ),
    "warmup": (
        "Compile the compiled kernels (smoe[fast], numba) now, once per machine, so that no "
        "later command pays the compile; say how long it took.",
        ("smoe warmup", "smoe warmup --json"),
    ),
}
"""Per subcommand its ``--help`` description and example command lines (data, not code:
a test checks every command has both, and that no markup leaks into ``--help``)."""


def _describe(p: argparse.ArgumentParser, name: str) -> None:
    """Give subcommand ``name``'s parser its description and examples (:data:`ABOUT`),
    unless it has its own (``dump``: from cmd_dump, with its own epilog)."""
    if name not in ABOUT:
        return
    text, examples = ABOUT[name]
    if p.description is None:  # (wrapped here: the raw formatter keeps the examples' lines)
        p.description = textwrap.fill(text, 88)
    if p.epilog is None:
        p.epilog = "examples:\n" + "".join(f"  {line}\n" for line in examples)
        p.formatter_class = argparse.RawDescriptionHelpFormatter


def build_dump_parser() -> argparse.ArgumentParser:
    """The parser of ``smoe-dump VAULT ...`` (the same options as ``smoe dump``).

    >>> args = build_dump_parser().parse_args(["v.smoe", "--experts"])
    >>> args.vault, args.experts, args.func.__name__
    (PosixPath('v.smoe'), True, 'cmd_dump')
    """
    summary = (commands.cmd_dump.__doc__ or "").split("\n\n")[0]  # not its example
    ap = _Parser(
        prog="smoe-dump",
        description=summary,
        epilog=_DUMP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _dump_args(ap)
    _version_flag(ap)
    _debug_flag(ap)
    return ap


# ---- one per command -----------------------------------------------------------------------
def _add_completion(sub: _Subparsers, top: argparse.ArgumentParser) -> None:
    from smoe.cli.completion import SHELLS, cmd_completion

    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh, fish)")
    p.add_argument("shell", choices=SHELLS, help="the shell to complete smoe in")
    p.set_defaults(func=lambda args: cmd_completion(args, top))


def _add_spec(sub: _Subparsers) -> None:
    p = sub.add_parser("spec", help="show the format's constants and struct layouts")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="machine-readable output")
    form.add_argument("--ksy", action="store_true", help="print the Kaitai Struct spec (.ksy)")
    p.set_defaults(func=commands.cmd_spec)


def _add_families(sub: _Subparsers) -> None:
    p = sub.add_parser(
        "families", help="list the model families sculpt converts or refuses, and why"
    )
    p.add_argument(
        "model_type",
        nargs="?",
        metavar="MODEL_TYPE",
        help="show one family in full (a config.json model_type, or an alias of one)",
    )
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="every field of every family")
    form.add_argument(
        "--markdown", action="store_true", help="the README's family table (Markdown)"
    )
    form.add_argument(
        "--long",
        action="store_true",
        help="the table with every column (config keys beyond the arch block, notes)",
    )
    p.set_defaults(func=commands.cmd_families)


def _add_sculpt(sub: _Subparsers) -> None:
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
        metavar="OUT",
        help="the folder where <stem>.smoe, .scout.safetensors, .smoe.manifest.json and "
        ".config.json go; or, ending in .smoe, the vault itself (its companions beside it, "
        "the stem its name)",
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
    _metadata_options(p)
    _sculpt_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    p.set_defaults(func=commands.cmd_sculpt)


def _sculpt_options(p: argparse.ArgumentParser) -> None:
    """What the vault holds and how it is written (``smoe sculpt``'s SculptOptions)."""
    p.add_argument(
        "--bits",
        type=int,
        choices=layout.SUPPORTED_BITS,
        default=layout.BITS_Q4,
        help=f"bits per weight of the experts' codes (default {layout.BITS_Q4}; 2 is half the "
        "size and loses more: see --calibrate)",
    )
    p.add_argument(
        "--format-version",
        type=int,
        default=layout.VERSION_MAX,
        choices=range(layout.VERSION_MIN, layout.VERSION_MAX + 1),
        help=f"the vault's format version (default {layout.VERSION_MAX}; 1 has no arch block, "
        "for readers of the original format)",
    )
    p.add_argument(
        "--max-layers", type=_positive_int, help="only the first N MoE layers (partial vault)"
    )
    p.add_argument(
        "--max-experts", type=_positive_int, help="only the first N experts of each layer"
    )
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"worker processes, at least 1 (default: the usable cores, "
        f"{usable_cores()} here; never more than there are batches of experts)",
    )
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    _force_flag(p, "replace an existing vault (and its scout, manifest and config copy)")
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
    cal = p.add_argument_group(
        "calibration (needs smoe[calibrate]: torch and transformers)",
        "Run the model over DATA one decoder layer at a time and quantise every routed "
        "expert for the least error of its output on the tokens routed to it (GPTQ-style, "
        "inside the format's own codes and scales: any reader reads the vault).",
    )
    cal.add_argument(
        "--calibrate",
        type=Path,
        metavar="DATA",
        help="token ids (.npy, or .safetensors with input_ids; 1-D or [sequences, tokens]) "
        "or UTF-8 text, tokenised with the checkpoint's own tokenizer",
    )
    cal.add_argument(
        "--device",
        default="cpu",
        metavar="DEV",
        help="where the calibration's forward passes run: cpu (default), cuda or cuda:N",
    )
    cal.add_argument(
        "--calib-seq-len",
        type=_positive_int,
        default=512,
        metavar="N",
        help="tokens per sequence for text and 1-D ids (default 512; 2-D ids keep theirs)",
    )
    cal.add_argument(
        "--calib-max-tokens",
        type=_positive_int,
        metavar="N",
        help="use at most N tokens of DATA, whole sequences (default: all)",
    )


def _add_verify(sub: _Subparsers) -> None:
    p = sub.add_parser("verify", help="check every rule of the format")
    _vault_arg(p)
    p.add_argument(
        "--deep",
        action="store_true",
        help="also read every blob (linear in size) and check the manifest",
    )
    _manifest_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable findings")
    p.set_defaults(func=commands.cmd_verify)


def _add_dump(sub: _Subparsers) -> None:
    p = sub.add_parser(
        "dump",
        help="show a vault as a tree (same as smoe-dump)",
        description=(commands.cmd_dump.__doc__ or "").split("\n\n")[0],
        epilog=_DUMP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _dump_args(p)


_DUMP_EPILOG = """\
with --experts (or --layer L) each expert and each tensor is one line naming it in full,
its fields padded with spaces to the vault's widest:
  layer 1 expert 3  blob at 0x20000, raw 3,264 B, padded 16,384 B, 96 groups
  layer 1 expert 3 down_proj  Q4  [64, 32]  packed +2176 (0x20880) 1,024 B  \
scales +3200 (0x20c80) 64 B
so `grep down_proj` keeps the layer and expert, and `grep -w 'layer 1 expert 3'` finds
that expert's lines.

--field NAME prints one value of the --json document: a dotted path of its keys, list
entries by index (experts.3 or experts[3], as a finding's field names them); a string
or number bare, an object or list as compact JSON (with --json: as a JSON document).
  smoe dump VAULT --field header.num_moe_layers
  smoe dump VAULT --field arch.model_type
  smoe dump VAULT --field 'experts[0].tensors[2].name'
an unknown name: one error line naming the nearest valid names, exit 2. The exit status
is otherwise the dump's: 0 valid, 1 a rule broken, 2 unreadable.
"""


def _add_export(sub: _Subparsers) -> None:
    p = sub.add_parser(
        "export",
        help="dequantise experts to float32 safetensors, or (--hf) "
        "a runnable HuggingFace checkpoint folder",
    )
    _vault_arg(p)
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
    _export_hf_options(p)
    _force_flag(
        p,
        "replace an existing output file (with --hf: a folder holding only what an export writes)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print what was written as JSON (schema smoe-export/1, or smoe-export-hf/1 with --hf)",
    )
    p.set_defaults(func=commands.cmd_export)


def _export_hf_options(p: argparse.ArgumentParser) -> None:
    """The options of ``smoe export --hf`` only."""
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
        "--rebuild-config",
        action="store_true",
        help="with --hf: rebuild config.json from the arch block and the scout, not copy "
        "it, also for a family whose config the vault cannot give exactly (deepseek_v2, "
        "deepseek_v3: what it assumes is printed); not with --config",
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


def _add_upgrade(sub: _Subparsers) -> None:
    p = sub.add_parser("upgrade", help="upgrade a v1 vault to v2 (arch block)")
    _vault_arg(p, "the v1 vault (edited in place unless --out)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path, help="the model's config.json")
    src.add_argument("--model", type=Path, help="the model directory (tensor shapes win)")
    p.add_argument(
        "--force",
        action="store_true",
        help="re-stamp the arch block of a v2 vault; with --out, replace an existing file "
        "(without it: refused)",
    )
    p.add_argument("--out", type=Path, help="write a v2 copy here instead of editing in place")
    p.add_argument(
        "--json", action="store_true", help="print the result as JSON (schema smoe-upgrade/1)"
    )
    p.set_defaults(func=commands.cmd_upgrade)


def _add_warmup(sub: _Subparsers) -> None:
    p = sub.add_parser(
        "warmup",
        help="compile the compiled kernels (smoe[fast]) now, once per machine, and say how long",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"schema": "smoe-warmup/1", "kernels": [...], "seconds": ...}',
    )
    p.set_defaults(func=commands.cmd_warmup)


def _add_report(sub: _Subparsers) -> None:
    p = sub.add_parser("report", help="write an HTML page picturing a vault (map, fields, SNR)")
    _vault_arg(p)
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        required=True,
        metavar="HTML",
        help="the page to write (atomically; never the vault or manifest)",
    )
    _force_flag(p, "replace an existing page")
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
    p.set_defaults(func=commands.cmd_report)


def _metadata_options(p: argparse.ArgumentParser) -> None:
    """``smoe sculpt``'s metadata for the manifest (``--name`` is the outputs' stem)."""
    g = p.add_argument_group(
        "metadata (the manifest's metadata object; smoe meta shows and edits it later)"
    )
    g.add_argument(
        "--title",
        type=_metadata("name"),
        metavar="TEXT",
        help="the model's human-readable name (metadata.name; --name is the file stem)",
    )
    g.add_argument(
        "--description", type=_metadata("description"), metavar="TEXT", help="a description"
    )
    g.add_argument(
        "--license",
        type=_metadata("license"),
        metavar="SPDX",
        help="the weights' license: an SPDX id or expression (Apache-2.0, 'MIT OR Apache-2.0')",
    )


def _add_meta(sub: _Subparsers) -> None:
    p = sub.add_parser(
        "meta",
        help="show or edit a vault's metadata (name, description, license, ...) in its manifest",
    )
    _vault_arg(p, "the vault (its manifest VAULT.manifest.json holds the metadata)")
    p.add_argument(
        "--set",
        type=_assignment,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set KEY (lower-case letters, digits, '_', parts joined by '.' or '-') to VALUE "
        "(text); repeatable",
    )
    p.add_argument(
        "--unset", type=_meta_key, action="append", default=[], metavar="KEY", help="remove KEY"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=commands.cmd_meta)


# ---- shared options ------------------------------------------------------------------------
def _force_flag(p: argparse.ArgumentParser, what: str) -> None:
    """``--force``: the one overwrite policy: an output that exists is refused without it."""
    p.add_argument("--force", action="store_true", help=what + " (without it: refused)")


def _vault_arg(p: argparse.ArgumentParser, text: str = "the vault (.smoe file)") -> None:
    p.add_argument("vault", type=Path, help=text)


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
    _vault_arg(p)
    p.add_argument("--experts", action="store_true", help="list every expert and its tensors")
    p.add_argument("--layer", type=int, help="expand one layer")
    p.add_argument("--deep", action="store_true", help="verify blob contents too, and the manifest")
    _manifest_args(p)
    p.add_argument("--json", action="store_true", help="the same content as JSON")
    p.add_argument(
        "--field",
        metavar="NAME",
        help="print only this value of the JSON content, e.g. header.num_moe_layers, "
        "arch.model_type, experts[0].tensors[2].rows (see below)",
    )
    p.set_defaults(func=commands.cmd_dump)


# ---- argument types ------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (``--jobs``)."""
    try:
        n = int(text, 10)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def _output_stem(text: str) -> str:
    """argparse type: a stem for the outputs (``sculpt --name``)."""
    from smoe.sculpt.source.hub import check_stem

    try:
        return check_stem(text)
    except SmoeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _metadata(key: str) -> Callable[[str], str]:
    """argparse type: the text of metadata ``key`` (``sculpt --title/--description/--license``)."""

    def text(value: str) -> str:
        from smoe.vault.meta import check_value

        try:
            return check_value(key, value)
        except SmoeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return text


def _assignment(text: str) -> tuple[str, str]:
    """argparse type: ``KEY=VALUE`` (``meta --set``)."""
    from smoe.vault.meta import parse_assignment

    try:
        return parse_assignment(text)
    except SmoeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _meta_key(text: str) -> str:
    """argparse type: a metadata key (``meta --unset``)."""
    from smoe.vault.meta import check_key

    try:
        return check_key(text)
    except SmoeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_SIZE_UNITS = {
    "": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def _shard_size(text: str) -> int:
    """``--max-shard-size``: bytes, or with a unit as save_pretrained takes it (5GB, 500MB)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 5GB, 500MB, 1000000)")
    value = int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").upper()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1 byte")
    return value
