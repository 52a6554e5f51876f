"""`smoe-stream` never loses or corrupts a file, and never hangs (issue 10), and
`check --deep` checks the integrity manifest (docs/MANIFEST.md).

* An output that is an input (same device and inode, through symlinks or hard links) is
  refused before anything is written; outputs are written to a new temporary file and
  renamed, so a planted symlink is replaced, never followed, and a full or read-only
  filesystem leaves nothing under the final name.
* FIFOs and other non-regular inputs are refused at once; a vault truncated before or
  while it is read gives a clean one-line error.
* `check --json` prints valid UTF-8 JSON for any path, and a JSON error object on failure.
* The manifest: a matching one passes; each kind of mismatch gives its code, offset and
  field; CRC-32C (SSE4.2 and table) agrees with the `crc32c` package.
"""

from __future__ import annotations

import json
import os
import random
import re
import struct
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from smoe.cli.console import valid_text

from fixtures_data import FIXTURES, MANIFEST, ROOT
from helpers import SMOE_STREAM, plain_env, refused, run, strict_json

STREAM = [SMOE_STREAM]  # run(..., command=STREAM, raw_stdout=True): stdout as bytes, checked
GOOD = FIXTURES / "q4_v2.smoe"
EXPERTS = MANIFEST["q4_v2.smoe"]["experts"]
ENTRY = 64  # first expert table entry; 48 bytes each: layer_id, expert_id, byte_offset, ...
D_MODEL = 64


pytestmark = pytest.mark.usefixtures("smoe_stream")


def failed_check(raw: bytes, vault: Path) -> dict:
    """The one error of a failed `check --json` (docs/JSON.md), from its findings document."""
    doc = strict_json(raw)
    assert (doc["schema"], doc["vault"], doc["valid"], doc["errors"]) == (
        "smoe-findings/1",
        str(vault),
        False,
        1,
    )
    (err,) = [f for f in doc["findings"] if f["severity"] == "error"]
    return err


def copy_vault(tmp_path: Path, name: str = "v.smoe") -> Path:
    path = tmp_path / name
    path.write_bytes(GOOD.read_bytes())
    return path


def x_file(tmp_path: Path) -> Path:
    path = tmp_path / "x.f32"
    path.write_bytes(struct.pack(f"<{D_MODEL}f", *[0.25] * D_MODEL))
    return path


def names(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


# ---------------------------------------------------------------- outputs that are inputs


def input_refusal(out: Path, src: Path) -> str:
    """The line that refuses to write ``out`` over the input ``src``."""
    return (
        f"smoe-stream: {out}: the output is the input {src} itself; refusing to overwrite an input"
    )


@pytest.mark.parametrize("how", ["same path", "symlink", "hard link"])
def test_forward_output_that_is_the_vault_is_refused(how: str, tmp_path: Path) -> None:
    vault, x = copy_vault(tmp_path), x_file(tmp_path)
    out = vault
    if how == "symlink":
        out = tmp_path / "link.f32"
        out.symlink_to(vault)
    elif how == "hard link":
        out = tmp_path / "hard.f32"
        os.link(vault, out)
    before = names(tmp_path)
    r = run("forward", vault, 0, 0, x, out, command=STREAM, raw_stdout=True)
    assert refused(r, 1) == input_refusal(out, vault)  # write_failed, as Python's
    assert vault.read_bytes() == GOOD.read_bytes()
    assert names(tmp_path) == before


def test_forward_output_that_is_the_input_is_refused(tmp_path: Path) -> None:
    vault, x = copy_vault(tmp_path), x_file(tmp_path)
    data = x.read_bytes()
    link = tmp_path / "y.f32"
    link.symlink_to(x)
    r = run("forward", vault, 0, 0, x, link, command=STREAM, raw_stdout=True)
    assert refused(r, 1) == input_refusal(link, x)
    assert x.read_bytes() == data and link.is_symlink()


@pytest.mark.parametrize("tensor", ["gate", "up", "down"])
def test_dequant_output_that_is_the_vault_is_refused(tensor: str, tmp_path: Path) -> None:
    vault = copy_vault(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    os.link(vault, out_dir / f"{tensor}.f32")
    r = run("dequant", vault, 0, 0, out_dir, command=STREAM, raw_stdout=True)
    assert refused(r, 1) == input_refusal(out_dir / f"{tensor}.f32", vault)
    assert vault.read_bytes() == GOOD.read_bytes()
    assert names(out_dir) == [f"{tensor}.f32"]


# ---------------------------------------------------------------- atomic outputs


def test_dequant_replaces_a_planted_symlink_instead_of_following_it(tmp_path: Path) -> None:
    vault = copy_vault(tmp_path)
    target = tmp_path / "precious"
    target.write_bytes(b"keep me\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "gate.f32").symlink_to(target)
    r = run("dequant", vault, 0, 0, out_dir, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == b"keep me\n"
    assert not (out_dir / "gate.f32").is_symlink()
    assert names(out_dir) == ["down.f32", "gate.f32", "up.f32"]
    assert (out_dir / "gate.f32").stat().st_size == 32 * D_MODEL * 4


@pytest.mark.parametrize("command", ["forward", "fp16-table"])
def test_outputs_replace_planted_symlinks(command: str, tmp_path: Path) -> None:
    vault, x = copy_vault(tmp_path), x_file(tmp_path)
    target = tmp_path / "precious"
    target.write_bytes(b"keep me\n")
    out = tmp_path / "out.f32"
    out.symlink_to(target)
    args = ("forward", vault, 0, 0, x, out) if command == "forward" else ("fp16-table", out)
    r = run(*args, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == b"keep me\n"
    assert not out.is_symlink()
    assert out.stat().st_size == (D_MODEL if command == "forward" else 65536) * 4
    assert names(tmp_path) == sorted(["out.f32", "precious", "v.smoe", "x.f32"])


def fill(folder: Path) -> None:
    """Fills a filesystem to the last byte."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (b"\xff" * 4096, b"\xff"):
            while True:
                try:
                    os.write(fd, chunk)
                except OSError:
                    break
    finally:
        os.close(fd)


def test_enospc_leaves_nothing_under_the_final_name(tmpfs, tmp_path: Path) -> None:
    small = tmpfs("small", "size=64k")
    out = small / "t.f32"
    r = run("fp16-table", out, command=STREAM, raw_stdout=True)
    line = refused(r, 1)  # a failed write: write_failed (exit 1), as Python's WriteFailed
    m = re.fullmatch(
        f"smoe-stream: {re.escape(str(out))}: cannot write (\\d+) bytes at "
        "offset (\\d+): No space left on device",
        line,
    )
    assert m, line
    assert int(m[1]) + int(m[2]) == 65536 * 4  # the rest of the table, from where it stopped
    assert names(small) == []


def test_enospc_in_dequant_writes_none_of_the_three(tmpfs, tmp_path: Path) -> None:
    vault = copy_vault(tmp_path)
    small = tmpfs("small", "size=16k")  # room for two of the three 8 KiB matrices
    r = run("dequant", vault, 0, 0, small, command=STREAM, raw_stdout=True)
    assert refused(r, 1) == (
        f"smoe-stream: {small}/down.f32: cannot write 8192 bytes at "
        "offset 0: No space left on device"
    )
    assert names(small) == []


def test_enospc_in_forward(tmpfs, tmp_path: Path) -> None:
    vault, x = copy_vault(tmp_path), x_file(tmp_path)
    small = tmpfs("small", "size=64k")
    fill(small)
    r = run("forward", vault, 0, 0, x, small / "y.f32", command=STREAM, raw_stdout=True)
    assert refused(r, 1) == (
        f"smoe-stream: {small}/y.f32: cannot write 256 bytes at offset 0: No space left on device"
    )
    assert names(small) == ["filler"]


def test_read_only_filesystem(tmpfs, tmp_path: Path) -> None:
    vault = copy_vault(tmp_path)
    small = tmpfs("small", "ro,size=64k")
    r = run("dequant", vault, 0, 0, small, command=STREAM, raw_stdout=True)
    assert refused(r, 1) == (f"smoe-stream: {small}/gate.f32: cannot create: Read-only file system")
    assert names(small) == []


# ---------------------------------------------------------------- non-regular inputs


def fifo_cases(tmp_path: Path) -> list[tuple[tuple, Path]]:
    vault, x = copy_vault(tmp_path), x_file(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    return [
        (("check", fifo), fifo),
        (("check", "--deep", fifo), fifo),
        (("forward", fifo, 0, 0, x, out / "y.f32"), fifo),
        (("forward", vault, 0, 0, fifo, out / "y.f32"), fifo),
        (("dequant", fifo, 0, 0, out), fifo),
        (("bench", fifo, "--seconds", "0.1"), fifo),
        (("check", "--deep", vault, "--manifest", fifo), fifo),
    ]


def test_fifo_inputs_are_refused_at_once(tmp_path: Path) -> None:
    """Exit 2 (unreadable); a manifest that cannot be read is a finding of the deep check
    instead (exit 1, manifest.malformed), as in `smoe verify --deep --manifest FIFO`."""
    for args, fifo in fifo_cases(tmp_path):
        r = run(*args, command=STREAM, raw_stdout=True)  # a hang would raise TimeoutExpired
        why = f"{fifo}: not a regular file (a FIFO)"
        if "--manifest" in args:
            vault = args[2]
            assert refused(r, 1) == (
                f"smoe-stream: {vault}: manifest.malformed at offset 0 (manifest): {why}"
            )
        else:
            assert refused(r, 2) == f"smoe-stream: {why}", args
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("path,kind", [("/dev/null", "a character device"), (".", "a folder")])
def test_other_non_regular_vaults_are_refused(path: str, kind: str) -> None:
    r = run("check", "--deep", path, command=STREAM, raw_stdout=True)
    assert refused(r, 2) == f"smoe-stream: {path}: not a regular file ({kind})"


# ---------------------------------------------------------------- truncation


def truncated(tmp_path: Path, index: int) -> tuple[Path, dict]:
    e = EXPERTS[index]
    path = tmp_path / "cut.smoe"
    path.write_bytes(GOOD.read_bytes()[: e["byte_offset"] + e["raw_size"] // 2])
    return path, e


def test_vault_truncated_in_a_blob_fails_cleanly_in_every_command(tmp_path: Path) -> None:
    path, e = truncated(tmp_path, 3)
    size = path.stat().st_size
    x = x_file(tmp_path)
    expected = (
        f"smoe-stream: {path}: entry.blob_bounds at offset {ENTRY + 3 * 48 + 16} "
        f"(experts[3].raw_size): blob of {e['raw_size']} bytes at {e['byte_offset']} "
        f"runs past the end of the file ({size} bytes)"
    )
    for args in (
        ("check", path),
        ("check", "--deep", path),
        ("forward", path, 0, 0, x, tmp_path / "y.f32"),
        ("dequant", path, 0, 0, tmp_path / "out"),
        ("bench", path, "--seconds", "0.1"),
    ):
        assert refused(run(*args, command=STREAM, raw_stdout=True), 1) == expected, args
    assert names(tmp_path) == ["cut.smoe", "x.f32"]


@pytest.fixture(scope="session")
def shrink_lib(tmp_path_factory) -> Path:
    """harness/tests/shrink_preload.c: truncates the vault at a fixed point of the reads."""
    lib = tmp_path_factory.mktemp("preload") / "shrink.so"
    src = ROOT / "harness" / "tests" / "shrink_preload.c"
    proc = run("-shared", "-fPIC", "-O1", "-o", lib, src, "-ldl", command=["cc"])
    assert proc.returncode == 0, proc.stderr
    return lib


def test_vault_shrinking_under_the_reader_fails_cleanly(shrink_lib: Path, tmp_path: Path) -> None:
    """Opened and checked at full size, then cut inside blob 3 at its first blob read."""
    x = x_file(tmp_path)
    e = EXPERTS[3]
    start = e["byte_offset"]
    gate_scales = start + e["tensors"][0]["scales_offset"]
    cases = [
        (("check", "--deep"), f"64 bytes at offset {gate_scales}, got 0"),
        (("forward", "@", 0, 3, x, tmp_path / "y.f32"), f"16384 bytes at offset {start}, got 1000"),
        (("dequant", "@", 0, 3, tmp_path / "out"), f"16384 bytes at offset {start}, got 1000"),
        (
            ("bench", "@", "--pattern", "seq", "--threads", 1, "--seconds", "0.05"),
            f"16384 bytes at offset {start}, got 1000",
        ),
    ]
    for args, what in cases:
        vault = copy_vault(tmp_path)
        args = tuple(vault if a == "@" else a for a in args) if "@" in args else (*args, vault)
        env = plain_env(
            LD_PRELOAD=str(shrink_lib),
            SMOE_SHRINK_FILE=str(vault),
            SMOE_SHRINK_AT=str(EXPERTS[0]["byte_offset"]),
            SMOE_SHRINK_TO=str(start + 1000),
        )
        r = run(*args, env=env, command=STREAM, raw_stdout=True)
        # exit 1 (failed), as Python's pread_exact: the file was opened and read, then shrank
        assert refused(r, 1) == f"smoe-stream: {vault}: file shrank while reading: {what}"
        assert vault.stat().st_size == start + 1000  # the shim did cut it
    assert names(tmp_path) == ["v.smoe", "x.f32"]


# ---------------------------------------------------------------- check --json


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff",
        b"\xc0\x80",
        b"\xed\xa0\x80",
        b"\xe2\x82",
        b"\xf4\x90\x80\x80",
        b"caf\xc3\xa9",
        b"tab\tnl\nbell\x07",
        b'quote"back\\',
    ],
)
def test_check_json_is_valid_utf8_for_any_path(raw: bytes, tmp_path: Path) -> None:
    path = os.fsencode(tmp_path) + b"/" + raw + b".smoe"
    with open(path, "wb") as f:
        f.write(GOOD.read_bytes())
    r = run("check", "--json", os.fsdecode(path), command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    out = strict_json(r.stdout)
    # U+FFFD per byte that is not well-formed UTF-8, as the Python CLI's JSON has it
    assert out["vault"] == valid_text(os.fsdecode(path))
    assert out["valid"] is True and out["manifest"] is None
    py = run("verify", "--json", os.fsdecode(path), raw_stdout=True)
    assert strict_json(py.stdout)["vault"] == out["vault"]


def test_check_json_prints_null_for_non_finite_floats(tmp_path: Path) -> None:
    data = bytearray(GOOD.read_bytes())
    arch = MANIFEST["q4_v2.smoe"]["header"]["reserved_ext"]
    struct.pack_into("<f", data, arch + 16, float("nan"))  # rope_theta
    struct.pack_into("<f", data, arch + 56, float("inf"))  # rms_norm_eps
    path = tmp_path / "nan.smoe"
    path.write_bytes(bytes(data))
    r = run("check", "--json", path, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    out = strict_json(r.stdout)
    assert out["arch"]["rope_theta"] is None and out["arch"]["rms_norm_eps"] is None
    # one warning per field, the value that is not a number as a string (docs/JSON.md)
    assert out["warnings"] == 2
    assert [
        (f["code"], f["field"], f["offset"], f["expected"], f["actual"], f["actual_text"])
        for f in out["findings"]
    ] == [
        ("arch.rope_theta", "arch.rope_theta", arch + 16, "finite", "nan", "nan"),
        ("arch.rms_norm_eps", "arch.rms_norm_eps", arch + 56, "finite", "inf", "inf"),
    ]
    text = run("check", path, command=STREAM, raw_stdout=True)
    assert text.returncode == 0 and text.stdout.decode().splitlines()[1:] == [
        f"warning: arch.rope_theta at offset {arch + 16:#x} (arch.rope_theta): rope_theta is "
        "not finite [expected finite, got nan]",
        f"warning: arch.rms_norm_eps at offset {arch + 56:#x} (arch.rms_norm_eps): "
        "rms_norm_eps is not finite [expected finite, got inf]",
    ]


def test_check_json_reports_io_and_usage_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.smoe"
    r = run("check", "--json", missing, command=STREAM, raw_stdout=True)
    assert refused(r, 2) == f"smoe-stream: {missing}: cannot open: No such file or directory"
    assert strict_json(r.stdout) == {
        "schema": "smoe-findings/1",
        "ok": False,
        "error": {"message": f"{missing}: cannot open: No such file or directory", "exit_code": 2},
    }

    r = run("check", "--json", "--bogus", GOOD, command=STREAM, raw_stdout=True)
    message = "check: unknown option --bogus (see smoe-stream --help)"
    assert refused(r, 2) == f"error: {message}"  # one line, as Python's usage errors
    assert strict_json(r.stdout) == {
        "schema": "smoe-findings/1",
        "ok": False,
        "error": {"message": message, "exit_code": 2},
    }

    r = run("check", "--json", command=STREAM, raw_stdout=True)
    assert r.returncode == 2
    assert strict_json(r.stdout)["error"] == {
        "message": "check: VAULT missing (see smoe-stream --help)",
        "exit_code": 2,
    }


def test_check_json_of_a_file_shorter_than_a_header(tmp_path: Path) -> None:
    """Judged (the findings document, code header.size) but unreadable: exit status 2."""
    path = tmp_path / "short.smoe"
    path.write_bytes(GOOD.read_bytes()[:30])
    r = run("check", "--json", path, command=STREAM, raw_stdout=True)
    assert refused(r, 2) == (
        f"smoe-stream: {path}: header.size at offset 0 (header): file of "
        "30 bytes is shorter than the 64-byte header"
    )
    assert failed_check(r.stdout, path) == {
        "code": "header.size",
        "severity": "error",
        "offset": 0,
        "field": "header",
        "message": "file of 30 bytes is shorter than the 64-byte header",
        "expected": 64,
        "actual": 30,
        "expected_text": "0x40 (64)",
        "actual_text": "0x1e (30)",
    }


# ---------------------------------------------------------------- CRC-32C


def test_crc32c_check_value() -> None:
    assert crc32c.crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 63, 64, 65, 4095, 100_003, (1 << 20) + 13])
def test_crc32c_both_implementations_match_the_crc32c_package(size: int, tmp_path: Path) -> None:
    data = random.Random(size).randbytes(size)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    r = run("crc32c", path, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    out = strict_json(r.stdout)
    want = crc32c.crc32c(data)
    assert out["size"] == size
    keys = ["crc32c", "portable", "portable_chunked", "sse42", "sse42_chunked"]
    if out["sse42"] is None:  # a CPU without SSE4.2: the portable loop is used
        keys = keys[:3]
    assert {k: out[k] for k in keys} == dict.fromkeys(keys, want)


def test_crc32c_of_the_check_value(tmp_path: Path) -> None:
    path = tmp_path / "check.txt"
    path.write_bytes(b"123456789")
    out = strict_json(run("crc32c", path, command=STREAM, raw_stdout=True).stdout)
    assert out["crc32c"] == out["portable"] == out["portable_chunked"] == 0xE3069283
    assert out["sse42"] in (None, 0xE3069283) and out["sse42_chunked"] in (None, 0xE3069283)


# ---------------------------------------------------------------- the integrity manifest


def manifest_for(vault: Path) -> dict:
    """The manifest of docs/MANIFEST.md, built from the vault's own table."""
    data = vault.read_bytes()
    n, bits = struct.unpack_from("<I", data, 20)[0], struct.unpack_from("<I", data, 44)[0]
    experts = []
    for i in range(n):
        layer, expert, offset, raw = struct.unpack_from("<IIQQ", data, ENTRY + 48 * i)
        experts.append(
            {
                "layer": layer,
                "expert": expert,
                "offset": offset,
                "raw_size": raw,
                "crc32c": crc32c.crc32c(data[offset : offset + raw]),
                "tensors": [
                    {
                        "name": name,
                        "source": f"model.layers.{layer}.mlp.experts.{expert}.{name}.weight",
                        "index": None,
                        "rows": None,
                        "source_crc32c": 0,
                        "snr_db": None,
                    }
                    for name in ("gate_proj", "up_proj", "down_proj")
                ],
            }
        )
    return {
        "schema": "smoe-manifest/1",
        "checksum": "crc32c",
        "vault": {"name": vault.name, "size": len(data), "experts": n, "bits": bits},
        "tool": {
            "name": "smoe",
            "version": "0",
            "command": "sculpt",
            "options": {"bits": bits, "version": 2},
        },
        "source": {"model_type": "olmoe", "files": [{"name": "model.safetensors", "size": 1}]},
        "experts": experts,
    }


def write_manifest(path: Path, manifest: dict | str | bytes) -> Path:
    if isinstance(manifest, dict):
        manifest = json.dumps(manifest, sort_keys=True, indent=2) + "\n"
    if isinstance(manifest, str):
        manifest = manifest.encode()
    path.write_bytes(manifest)
    return path


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    """A copy of q4_v2.smoe with its manifest beside it."""
    path = copy_vault(tmp_path)
    write_manifest(tmp_path / "v.smoe.manifest.json", manifest_for(path))
    return path


def side(vault: Path) -> Path:
    return vault.parent / (vault.name + ".manifest.json")


def expect(vault: Path, code: str, offset: int, field: str, message: str, *extra: object) -> None:
    """`check --deep` fails with exactly this rule line, and --json with its error."""
    r = run("check", "--deep", vault, *extra, command=STREAM, raw_stdout=True)
    assert refused(r, 1) == f"smoe-stream: {vault}: {code} at offset {offset} ({field}): {message}"
    r = run("check", "--deep", "--json", vault, *extra, command=STREAM, raw_stdout=True)
    assert r.returncode == 1
    err = failed_check(r.stdout, vault)
    assert (err["code"], err["field"], err["offset"], err["message"]) == (
        code,
        field,
        offset,
        message,
    )


def test_matching_manifest_passes(vault: Path) -> None:
    r = run("check", "--deep", vault, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.decode().splitlines()[:2] == [
        f"{vault}: valid SMOE-Q4 v2 vault, 8 experts",
        f"manifest {side(vault)}: size, 8 experts and their CRC-32C match",
    ]
    r = run("check", "--deep", "--json", vault, command=STREAM, raw_stdout=True)
    assert strict_json(r.stdout)["manifest"] == str(side(vault))


def test_manifest_is_only_read_with_deep(vault: Path) -> None:
    write_manifest(side(vault), "not json")
    r = run("check", "--json", vault, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    assert strict_json(r.stdout)["manifest"] is None


def test_vault_without_manifest_checks_as_before(tmp_path: Path) -> None:
    path = copy_vault(tmp_path)
    r = run("check", "--deep", "--json", path, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    out = strict_json(r.stdout)
    assert out["valid"] is True and out["deep"] is True and out["manifest"] is None


@pytest.mark.parametrize("index,flip", [(0, 0), (5, 700)])
def test_flipped_bit_in_a_blob(vault: Path, index: int, flip: int) -> None:
    e = EXPERTS[index]
    data = bytearray(vault.read_bytes())
    want = crc32c.crc32c(bytes(data[e["byte_offset"] : e["byte_offset"] + e["raw_size"]]))
    data[e["byte_offset"] + flip] ^= 0x10  # a code byte: every format rule still holds
    vault.write_bytes(bytes(data))
    got = crc32c.crc32c(bytes(data[e["byte_offset"] : e["byte_offset"] + e["raw_size"]]))
    expect(
        vault,
        "manifest.checksum",
        e["byte_offset"],
        f"manifest/experts/{index}/crc32c",
        f"{side(vault)}: the blob of (layer {e['layer_id']}, expert {e['expert_id']}) has "
        f"CRC-32C 0x{got:08x}, the manifest says 0x{want:08x}",
    )


def test_zeroed_blob(vault: Path) -> None:
    e = EXPERTS[2]
    data = bytearray(vault.read_bytes())
    want = crc32c.crc32c(bytes(data[e["byte_offset"] : e["byte_offset"] + e["raw_size"]]))
    data[e["byte_offset"] : e["byte_offset"] + e["raw_size"]] = bytes(e["raw_size"])
    vault.write_bytes(bytes(data))
    r = run("check", "--deep", "--no-manifest", vault, command=STREAM, raw_stdout=True)
    assert r.returncode == 0  # looks plausible
    expect(
        vault,
        "manifest.checksum",
        e["byte_offset"],
        "manifest/experts/2/crc32c",
        f"{side(vault)}: the blob of (layer 0, expert 2) has CRC-32C "
        f"0x{crc32c.crc32c(bytes(e['raw_size'])):08x}, the manifest says 0x{want:08x}",
    )


def test_format_rules_come_before_the_checksum(vault: Path) -> None:
    e = EXPERTS[1]
    data = bytearray(vault.read_bytes())
    data[e["byte_offset"] + e["raw_size"] + 5] = 1  # padding: not covered by the CRC
    vault.write_bytes(bytes(data))
    at = e["byte_offset"] + e["raw_size"] + 5
    expect(
        vault,
        "blob.padding",
        at,
        "experts[1].padding",
        f"padding byte at blob offset {e['raw_size'] + 5} is not zero",
    )


def test_wrong_vault_size(vault: Path) -> None:
    m = manifest_for(vault)
    m["vault"]["size"] += 16384
    write_manifest(side(vault), m)
    expect(
        vault,
        "manifest.vault",
        0,
        "manifest/vault/size",
        f"{side(vault)}: vault.size 163840 is not this vault's 147456 (the manifest belongs to "
        "another file)",
    )


def test_wrong_expert_count(vault: Path) -> None:
    m = manifest_for(vault)
    m["vault"]["experts"] = 7
    write_manifest(side(vault), m)
    expect(
        vault,
        "manifest.vault",
        0,
        "manifest/vault/experts",
        f"{side(vault)}: vault.experts 7 is not this vault's 8 (the manifest belongs to "
        "another file)",
    )


@pytest.mark.parametrize("edit", ["drop 2", "drop 7", "add 8"])
def test_missing_or_extra_expert_entry(vault: Path, edit: str) -> None:
    m = manifest_for(vault)
    if edit == "add 8":
        m["experts"].append(dict(m["experts"][7], expert=4))
    else:
        del m["experts"][int(edit[-1])]
    write_manifest(side(vault), m)
    listed = 9 if edit == "add 8" else 7
    expect(
        vault,
        "manifest.expert",
        0,
        "manifest/experts",
        f"{side(vault)}: lists {listed} experts, the table has 8",
    )


ENTRY_CASES = [  # (entry, key, value in the manifest, the table's value)
    (4, "layer", 2, 1),
    (2, "expert", 3, 2),
    (6, "offset", 131072, 114688),
    (1, "raw_size", 3200, 3264),
    (0, "offset", 2**64 - 1, 16384),  # the largest integer, read exactly
]


@pytest.mark.parametrize("index,key,value,actual", ENTRY_CASES)
def test_entry_differs_from_the_table(
    vault: Path, index: int, key: str, value: int, actual: int
) -> None:
    m = manifest_for(vault)
    m["experts"][index][key] = value
    write_manifest(side(vault), m)
    e = EXPERTS[index]
    expect(
        vault,
        "manifest.expert",
        e["byte_offset"],
        f"manifest/experts/{index}/{key}",
        f"{side(vault)}: table entry {index} (layer {e['layer_id']}, expert {e['expert_id']}) "
        f"has {key} {actual}, the manifest says {value}",
    )


def good_text(vault: Path) -> str:
    return json.dumps(manifest_for(vault), sort_keys=True, indent=2) + "\n"


MALFORMED_TEXT = [
    (
        "trailing comma",
        lambda t: t.replace('"vault": {', '"vault": {"x": 1,,', 1),
        "not valid JSON at byte {pos}: expected a string key",
    ),
    ("cut short", lambda t: t[:200], "not valid JSON at byte 200: unterminated string"),
    ("two values", lambda t: t + "{}", "not valid JSON at byte {end}: data after the JSON value"),
    (
        "NaN",
        lambda t: t.replace('"snr_db": null', '"snr_db": NaN', 1),
        "not valid JSON at byte {pos}: unexpected character 'N'",
    ),
    (
        "leading zero",
        lambda t: t.replace('"bits": 4', '"bits": 04', 1),
        "not valid JSON at byte {pos}: expected ',' or '}}'",
    ),
    (
        "raw newline in a string",
        lambda t: t.replace('"olmoe"', '"olm\noe"', 1),
        "not valid JSON at byte {pos}: control character in a string",
    ),
    ("empty", lambda t: "", "not valid JSON at byte 0: unexpected end of the text"),
]


@pytest.mark.parametrize("case,edit,why", MALFORMED_TEXT, ids=[c[0] for c in MALFORMED_TEXT])
def test_bad_json(vault: Path, case: str, edit, why: str) -> None:
    text = good_text(vault)
    bad = edit(text)
    # the byte where a reader must stop: the first that differs, +1 where the edit inserts
    # a character that is itself fine (the second comma, the 4 after 0, the newline)
    pos = next((k for k, (a, b) in enumerate(zip(text, bad)) if a != b), len(text))
    pos += {"trailing comma": 7, "leading zero": 1}.get(case, 0)
    write_manifest(side(vault), bad)
    expect(
        vault,
        "manifest.malformed",
        0,
        "manifest",
        f"{side(vault)}: " + why.format(pos=pos, end=len(text)),
    )


def test_invalid_utf8_in_a_string(vault: Path) -> None:
    text = good_text(vault).encode()
    at = text.index(b"olmoe")
    write_manifest(side(vault), text[:at] + b"\xc3\x28" + text[at + 2 :])
    expect(
        vault,
        "manifest.malformed",
        0,
        "manifest",
        f"{side(vault)}: not valid JSON at byte {at}: invalid UTF-8 in a string",
    )


def test_escaped_unicode_and_lone_surrogates_are_accepted(vault: Path) -> None:
    m = manifest_for(vault)
    m["vault"]["name"] = "v\udcff\u00e9\U0001f600.smoe"  # a surrogate-escaped file name
    text = json.dumps(m, sort_keys=True, indent=2, ensure_ascii=True) + "\n"
    assert "\\udcff" in text and "\\ud83d\\ude00" in text
    write_manifest(side(vault), text)
    assert run("check", "--deep", vault, command=STREAM, raw_stdout=True).returncode == 0


def test_nesting_is_bounded(vault: Path) -> None:
    m = manifest_for(vault)
    m["tool"]["options"]["deep"] = json.loads("[" * 13 + "]" * 13)  # 16 levels in all: fine
    write_manifest(side(vault), m)
    r = run("check", "--deep", vault, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, side(vault).read_text()[:200]
    deep = '"source": {"deep": ' + "[" * 15 + "]" * 15 + ", "
    text = good_text(vault).replace('"source": {', deep, 1)
    write_manifest(side(vault), text)
    pos = text.index("[" * 15) + 14  # the 17th level: root, source, then 15 arrays
    expect(
        vault,
        "manifest.malformed",
        0,
        "manifest",
        f"{side(vault)}: not valid JSON at byte {pos}: nested deeper than 16 levels",
    )


def test_size_is_bounded(vault: Path) -> None:
    limit = (64 << 20) + 4096 * 8
    with open(side(vault), "wb") as f:
        f.truncate(limit + 1)  # sparse; refused from its size without being read
    expect(
        vault,
        "manifest.malformed",
        0,
        "manifest",
        f"{side(vault)} is {limit + 1} bytes, more than the {limit} bytes allowed for 8 experts",
    )


SCHEMA_CASES = [
    (
        "schema",
        lambda m: m.update(schema="smoe-manifest/2"),
        "manifest/schema",
        'schema "smoe-manifest/2" is not "smoe-manifest/1"',
    ),
    (
        "schema on two lines",  # echoed escaped, so the error stays one line
        lambda m: m.update(schema="smoe-manifest/1\nx"),
        "manifest/schema",
        'schema "smoe-manifest/1\\u000ax" is not "smoe-manifest/1"',
    ),
    ("no schema", lambda m: m.pop("schema"), "manifest/schema", "key missing"),
    (
        "checksum",
        lambda m: m.update(checksum="xxh3"),
        "manifest/checksum",
        'checksum "xxh3" is not "crc32c"',
    ),
    ("checksum type", lambda m: m.update(checksum=1), "manifest/checksum", "not a string"),
    ("vault type", lambda m: m.update(vault=[]), "manifest/vault", "not an object"),
    (
        "size negative",
        lambda m: m["vault"].update(size=-1),
        "manifest/vault/size",
        "not an integer in [0, 2^64)",
    ),
    (
        "size too big",
        lambda m: m["vault"].update(size=2**64),
        "manifest/vault/size",
        "not an integer in [0, 2^64)",
    ),
    (
        "experts float",
        lambda m: m["vault"].update(experts=8.0),
        "manifest/vault/experts",
        "not an integer in [0, 2^64)",
    ),
    ("experts type", lambda m: m.update(experts={}), "manifest/experts", "not an array"),
    (
        "entry type",
        lambda m: m["experts"].__setitem__(3, None),
        "manifest/experts/3",
        "not an object",
    ),
    (
        "crc range",
        lambda m: m["experts"][3].update(crc32c=2**32),
        "manifest/experts/3/crc32c",
        "not an integer in [0, 2^32)",
    ),
    (
        "crc bool",
        lambda m: m["experts"][3].update(crc32c=True),
        "manifest/experts/3/crc32c",
        "not an integer in [0, 2^32)",
    ),
    (
        "layer missing",
        lambda m: m["experts"][5].pop("layer"),
        "manifest/experts/5/layer",
        "key missing",
    ),
]


@pytest.mark.parametrize("case,edit,field,why", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_wrong_schema_and_types(vault: Path, case: str, edit, field: str, why: str) -> None:
    m = manifest_for(vault)
    edit(m)
    write_manifest(side(vault), m)
    expect(vault, "manifest.malformed", 0, field, f"{side(vault)}: {why}")


def test_unknown_keys_are_ignored(vault: Path) -> None:
    m = manifest_for(vault)
    m["later"] = {"anything": [1.5e300, -2, "\u00e9", True, None]}
    m["experts"][0]["extra"] = {"a": [1, 2, 3]}
    write_manifest(side(vault), m)
    assert run("check", "--deep", vault, command=STREAM, raw_stdout=True).returncode == 0


def test_manifest_option_and_no_manifest(vault: Path, tmp_path: Path) -> None:
    elsewhere = write_manifest(tmp_path / "other.json", manifest_for(vault))
    write_manifest(side(vault), "not json")
    r = run("check", "--deep", vault, "--manifest", elsewhere, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    assert f"manifest {elsewhere}: " in r.stdout.decode()
    assert (
        run("check", "--deep", "--no-manifest", vault, command=STREAM, raw_stdout=True).returncode
        == 0
    )
    missing = tmp_path / "missing.json"  # a finding (exit 1), as `smoe verify --manifest` says
    r = run("check", "--deep", vault, f"--manifest={missing}", command=STREAM, raw_stdout=True)
    assert refused(r, 1) == (
        f"smoe-stream: {vault}: manifest.malformed at offset 0 (manifest): "
        f"{missing}: cannot open: No such file or directory"
    )
    for args in (
        ("--manifest", elsewhere),
        ("--no-manifest",),
        ("--deep", "--no-manifest", "--manifest", elsewhere),
    ):
        r = run("check", vault, *args, command=STREAM, raw_stdout=True)
        assert refused(r, 2).startswith("error: check: --manifest and ")


def test_manifest_of_another_vault(vault: Path, tmp_path: Path) -> None:
    """A Q2 vault of the same size and table: its manifest fails on the first raw_size."""
    other = tmp_path / "q2.smoe"
    other.write_bytes((FIXTURES / "q2_v2.smoe").read_bytes())
    m = manifest_for(other)
    assert m["vault"]["size"] == vault.stat().st_size
    write_manifest(side(vault), m)
    expect(
        vault,
        "manifest.expert",
        EXPERTS[0]["byte_offset"],
        "manifest/experts/0/raw_size",
        f"{side(vault)}: table entry 0 (layer 0, expert 0) has raw_size "
        f"{EXPERTS[0]['raw_size']}, the manifest says {m['experts'][0]['raw_size']}",
    )


SANITIZER_ENV = plain_env(
    ASAN_OPTIONS="exitcode=86:max_allocation_size_mb=256:detect_leaks=1",
    UBSAN_OPTIONS="exitcode=87:print_stacktrace=1",
)
INSERTS = [
    b"[",
    b"{",
    b'"',
    b"\\u",
    b"\\ud800",
    b"-",
    b"1e999",
    b"18446744073709551616",
    b"\xff",
    b"\xe2\x82",
    b",",
    b"]]]]",
    b"\x00",
    b"null",
    b"0.5",
]


def test_mutated_manifests_never_crash_under_sanitizers(
    make: Callable[..., None], tmp_path: Path
) -> None:
    """300 seeded mutations of a manifest (bytes replaced, cut, spliced in): the ASan/UBSan
    build exits 0 or 1 with a manifest finding, never crashes or reports."""
    make("build/asan/smoe-stream")
    vault = copy_vault(tmp_path)
    base = good_text(vault).encode()
    rng = random.Random(10)
    codes: dict[int, int] = {}
    for _ in range(300):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data) + 1)
            op = rng.randrange(4)
            if op == 0 and pos < len(data):
                data[pos] = rng.randrange(256)
            elif op == 1:
                del data[pos : pos + rng.randint(1, 64)]
            elif op == 2:
                data[pos:pos] = rng.choice(INSERTS)
            else:
                del data[pos:]
        side(vault).write_bytes(bytes(data))
        asan = [ROOT / "build" / "asan" / "smoe-stream"]
        r = run("check", "--deep", "--json", vault, command=asan, env=SANITIZER_ENV, text=False)
        assert r.returncode in (0, 1), (bytes(data)[:300], r.stderr[-2000:])
        if r.returncode == 1:
            assert failed_check(r.stdout, vault)["code"].startswith("manifest.")
        else:
            assert strict_json(r.stdout)["valid"] is True
        codes[r.returncode] = codes.get(r.returncode, 0) + 1
    assert codes.get(1, 0) > 150, codes  # most mutations break the manifest
