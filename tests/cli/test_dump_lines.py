"""Grep-able dumps (issue 25): ``smoe dump --experts`` names the layer, expert and tensor on
every line, the JSON descriptors carry ``name`` and ``type_name``, and ``--field NAME``
prints one value of the JSON content.

Each expert line is ``layer L expert E  blob at ...`` and each tensor line ``layer L expert E
NAME  TYPE  [ROWS, COLS]  packed +OFF (0xABS) SIZE B  scales +OFF (0xABS) SIZE B``, every
field padded to the vault's widest (smoe.cli.dump.EXPERT_LINE, TENSOR_LINE; README.md).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from smoe import cli
from smoe_gen import layout
from smoe_gen.layout import TENSOR_NAMES
from smoe_testkit.synth import write_sparse_vault

from fixtures_data import CORRUPT, FIXTURES, GOOD, ROOT
from helpers import SMOE, SMOE_DUMP, refused, run, strict_json

Q4 = FIXTURES / "q4_v2.smoe"
GUIDES = re.compile(r"^[│├└─ ]*")  # the tree's guide characters in front of a node
TENSOR = re.compile(
    r"layer (\d+) expert (\d+) (\S+) +(Q[24])  \[(\d+), (\d+)\] +packed \+(\d+) +\((0x[0-9a-f]+)\)"
    r" +([\d,]+) B  scales \+(\d+) +\((0x[0-9a-f]+)\) +([\d,]+) B"
)
EXPERT = re.compile(
    r"layer (\d+) expert (\d+) +blob at (0x[0-9a-f]+), raw ([\d,]+) B, padded ([\d,]+) B, "
    r"(\d+) groups"
)

# layer 1 expert 3 of fixtures/q4_v2.smoe, as README.md and smoe dump --help show it
EXPERT_3 = [
    "layer 1 expert 3  blob at 0x20000, raw 3,264 B, padded 16,384 B, 96 groups",
    "layer 1 expert 3 gate_proj  Q4  [32, 64]  packed +0    (0x20000) 1,024 B  "
    "scales +1024 (0x20400) 64 B",
    "layer 1 expert 3 up_proj    Q4  [32, 64]  packed +1088 (0x20440) 1,024 B  "
    "scales +2112 (0x20840) 64 B",
    "layer 1 expert 3 down_proj  Q4  [64, 32]  packed +2176 (0x20880) 1,024 B  "
    "scales +3200 (0x20c80) 64 B",
]


def dump(*args: str | Path, command: list[str] = SMOE) -> str:
    proc = run(*([] if command is SMOE_DUMP else ["dump"]), *args, command=command)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


def nodes(text: str) -> list[str]:
    """The tree's lines without their guide characters."""
    return [GUIDES.sub("", line) for line in text.splitlines()]


def grep(text: str, needle: str) -> list[str]:
    """What ``grep -F NEEDLE`` prints, guides removed."""
    return [line for line in nodes(text) if needle in line]


def grep_w(text: str, words: str) -> list[str]:
    """What ``grep -w WORDS`` prints, guides removed."""
    pattern = re.compile(rf"(?<!\w){re.escape(words)}(?!\w)")
    return [line for line in nodes(text) if pattern.search(line)]


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 layers of 128 experts: ids of one, two and three digits."""
    path = tmp_path_factory.mktemp("wide") / "wide.smoe"
    return write_sparse_vault(path, layers=12, experts=128, d_model=64, ffn=32, vocab=320)


# ---- the lines of --experts ----------------------------------------------------------------
def test_one_experts_lines_word_for_word() -> None:
    out = dump(Q4, "--experts")
    assert grep_w(out, "layer 1 expert 3") == EXPERT_3
    assert grep(out, "layer 1 expert 3 ") == EXPERT_3


@pytest.mark.parametrize("name", GOOD)
def test_every_tensor_line_names_its_layer_expert_and_tensor(name: str) -> None:
    path = FIXTURES / name
    doc = strict_json(run("dump", "--json", path).stdout)
    out = dump(path, "--experts")
    bits = f"Q{doc['header']['bits']}"
    for e in doc["experts"]:
        lay, eid, base = e["layer_id"], e["expert_id"], e["byte_offset"]
        expert, *tensors = grep_w(out, f"layer {lay} expert {eid}")
        m = EXPERT.fullmatch(expert)
        assert m is not None, expert
        assert m.groups() == (
            str(lay),
            str(eid),
            f"{base:#x}",
            f"{e['raw_size']:,}",
            f"{e['padded_size']:,}",
            str(e["num_groups"]),
        )
        assert len(tensors) == layout.TENSORS_PER_EXPERT
        for line, d, tname in zip(tensors, e["tensors"], TENSOR_NAMES):
            m = TENSOR.fullmatch(line)
            assert m is not None, line
            assert m.groups() == (
                str(lay),
                str(eid),
                tname,
                bits,
                str(d["rows"]),
                str(d["cols"]),
                str(d["packed_offset"]),
                f"{base + d['packed_offset']:#x}",
                f"{d['packed_size']:,}",
                str(d["scales_offset"]),
                f"{base + d['scales_offset']:#x}",
                f"{d['scales_size']:,}",
            )
    for tname in TENSOR_NAMES:  # grep NAME: one line per expert, each with its context
        lines = grep(out, f" {tname}  ")
        assert [TENSOR.fullmatch(line).group(3) for line in lines] == [tname] * len(doc["experts"])


def columns(line: str) -> list[int]:
    """Where each field of a tensor line starts."""
    m = TENSOR.fullmatch(line)
    assert m is not None, line
    return [m.start(i) for i in range(4, 13)]


def test_columns_line_up_across_ids_of_every_width(wide: Path) -> None:
    out = dump(wide, "--experts")
    tensors = [line for line in nodes(out) if TENSOR.fullmatch(line)]
    experts = [line for line in nodes(out) if EXPERT.fullmatch(line)]
    assert (len(experts), len(tensors)) == (12 * 128, 12 * 128 * 3)
    assert len({columns(line) == columns(tensors[0]) for line in tensors}) == 1
    assert len({len(line) for line in tensors}) == 1  # the last field is right-aligned
    assert len({line.index("blob at") for line in experts}) == 1
    assert tensors[0] == (
        "layer 0 expert 0 gate_proj     Q4  [32, 64]  packed +0    (0x44000)   1,024 B  "
        "scales +1024 (0x44400)   64 B"
    )
    assert grep_w(out, "layer 11 expert 127")[3] == (
        "layer 11 expert 127 down_proj  Q4  [64, 32]  packed +2176 (0x1840880) 1,024 B  "
        "scales +3200 (0x1840c80) 64 B"
    )
    # grep -w (or a trailing space) tells expert 1 from experts 10-19 and 100-127
    assert len(grep_w(out, "layer 3 expert 1")) == 4
    assert len(grep(out, "layer 3 expert 1 ")) == 4
    assert len(grep(out, "layer 3 expert 1")) == 4 * (1 + 10 + 28)
    assert len(grep(out, "down_proj ")) == 12 * 128 + 12  # and each layer's summary line


def test_a_line_is_the_same_whichever_layer_is_shown(wide: Path) -> None:
    every = nodes(dump(wide, "--experts"))
    one = nodes(dump(wide, "--layer", "7"))
    mine = [line for line in one if line.startswith("layer 7 expert ")]
    assert len(mine) == 128 * 4
    assert mine == [line for line in every if line.startswith("layer 7 expert ")]
    assert not [line for line in one if line.startswith("layer 6 expert ")]


def test_smoe_dump_prints_the_same_lines() -> None:
    assert dump(Q4, "--experts", command=SMOE_DUMP) == dump(Q4, "--experts")
    assert dump(Q4, "--layer", "1", command=SMOE_DUMP) == dump(Q4, "--layer", "1")


def test_the_collapsed_tree_is_unchanged() -> None:
    out = nodes(dump(Q4))
    assert "layer 1: 4 experts (ids 0-3), gate_proj 32x64 up_proj 32x64 down_proj 64x32, " in (
        "\n".join(out)
    )
    assert not [line for line in out if EXPERT.fullmatch(line) or TENSOR.fullmatch(line)]


def test_readme_and_help_show_the_real_lines() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "```\n" + "\n".join(EXPERT_3) + "\n```\n" in readme
    for command, args in ((SMOE, ["dump", "--help"]), (SMOE_DUMP, ["--help"])):
        proc = run(*args, command=command)
        assert proc.returncode == 0, proc.stderr
        helped = proc.stdout.splitlines()
        assert f"  {EXPERT_3[0]}" in helped and f"  {EXPERT_3[3]}" in helped
        assert "--field NAME" in proc.stdout
        assert "  smoe dump VAULT --field arch.model_type" in helped


def test_an_undefined_tensor_type_is_shown_as_its_value(tmp_path: Path) -> None:
    vault = tmp_path / "t.smoe"
    data = bytearray(Q4.read_bytes())
    at = layout.descriptor_offset(8, 0, 1) + layout.TENSOR_DESCRIPTOR_OFFSETS["tensor_type"]
    data[at] = 7  # experts[0].tensors[1].tensor_type
    vault.write_bytes(data)
    proc = run("dump", "--experts", vault)
    assert proc.returncode == 1
    assert grep(proc.stdout, "layer 0 expert 0 tensor_type=7 ")[0].startswith(
        "layer 0 expert 0 tensor_type=7  Q4  [32, 64]  packed +1088 (0x4440)  1,024 B  "
    )
    desc = strict_json(run("dump", "--json", vault).stdout)["experts"][0]["tensors"][1]
    assert (desc["tensor_type"], desc["name"], desc["type_name"]) == (7, None, "Q4")


# ---- JSON: name and type_name -----------------------------------------------------------
@pytest.mark.parametrize("name", GOOD)
def test_json_descriptors_carry_name_and_type_name(name: str) -> None:
    doc = strict_json(run("dump", "--json", FIXTURES / name).stdout)
    assert doc["schema"] == "smoe-findings/1"
    bits = doc["header"]["bits"]
    for e in doc["experts"]:
        for d, tname in zip(e["tensors"], TENSOR_NAMES):
            assert list(d)[:3] == ["tensor_type", "name", "type_name"]
            assert (d["name"], d["type_name"]) == (tname, f"Q{bits}")
    assert {d["type_name"] for e in doc["experts"] for d in e["tensors"]} == {
        "Q2" if name.startswith("q2") else "Q4"
    }


# ---- --field ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "printed"),
    [
        ("header.num_moe_layers", "2"),
        ("header.bits", "4"),
        ("header.magic", "534d4f45deea0001"),
        ("arch.model_type", "olmoe"),
        ("arch.rms_norm_eps", "9.999999747378752e-06"),
        ("arch.flag_names", "[]"),
        ("file.vault_type", "full"),
        ("schema", "smoe-findings/1"),
        ("experts[7].tensors[2].name", "down_proj"),
        ("experts.7.tensors.2.rows", "64"),
        ("experts[7].tensors[2].type_name", "Q4"),
        ("experts[1].expert_id", "1"),
        (
            "experts[7].tensors[2]",
            '{"tensor_type":2,"name":"down_proj","type_name":"Q4","ndim":2,"reserved_0":"0000",'
            '"rows":64,"cols":32,"packed_offset":2176,"packed_size":1024,"scales_offset":3200,'
            '"scales_size":64}',
        ),
        ("file", '{"path":"fixtures/q4_v2.smoe","size":147456,"vault_type":"full"}'),
    ],
)
def test_field_prints_one_value(
    name: str, printed: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the path as the document gives it
    assert in_process(capsys, "dump", "fixtures/q4_v2.smoe", "--field", name) == (
        0,
        printed + "\n",
        "",
    )


def test_field_from_both_commands() -> None:
    for command, args in ((SMOE, ["dump"]), (SMOE_DUMP, [])):
        proc = run(*args, Q4, "--field", "experts[7].tensors[2].name", command=command)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "down_proj\n", "")


def in_process(capsys: pytest.CaptureFixture, *args: str | Path) -> tuple[int, str, str]:
    """``smoe ARGS`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_field_is_a_value_of_the_json_document(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = in_process(capsys, "dump", "--json", Q4)
    doc = strict_json(out)
    for name, want in (
        ("header", doc["header"]),
        ("experts[3].tensors", doc["experts"][3]["tensors"]),
        ("findings", doc["findings"]),
        ("arch.rope_theta", doc["arch"]["rope_theta"]),
    ):
        code, out, _ = in_process(capsys, "dump", Q4, "--field", name)
        assert code == 0
        assert json.loads(out) == want
        assert len(out.splitlines()) == 1
        code, out, _ = in_process(capsys, "dump", Q4, "--field", name, "--json")
        assert strict_json(out) == want
    assert in_process(capsys, "dump", Q4, "--field", "arch.model_type", "--json")[1] == (
        '"olmoe"\n'
    )


def test_field_keeps_the_dumps_exit_status(capsys: pytest.CaptureFixture) -> None:
    bad = CORRUPT / "bad_magic.smoe"
    assert in_process(capsys, "dump", bad, "--field", "header.magic") == (
        1,
        "584d4f45deea0001\n",
        "",
    )
    v1 = FIXTURES / "q4_v1.smoe"
    assert in_process(capsys, "dump", v1, "--field", "header.version") == (0, "1\n", "")


@pytest.mark.parametrize(
    ("vault", "name", "message"),
    [
        (
            Q4,
            "header.num_layers",
            "--field header.num_layers: no such field (nearest: header.num_moe_layers, "
            "header.max_experts_per_layer, header.version)",
        ),
        (
            Q4,
            "arch.model",
            "--field arch.model: no such field (nearest: arch.model_type, arch.moe_top_k, "
            "arch.moe_ffn_dim)",
        ),
        (Q4, "foo", "--field foo: no such field (nearest: file, findings, provenance)"),
        (
            Q4,
            "experts[8].expert_id",
            "--field experts[8].expert_id: no such field (experts is a list of 8 entries, "
            "experts[0]..experts[7])",
        ),
        (
            Q4,
            "experts.name",
            "--field experts.name: no such field (experts is a list of 8 entries, "
            "experts[0]..experts[7])",
        ),
        (
            Q4,
            "header.bits.low",
            "--field header.bits.low: no such field (header.bits is a value, it has no fields)",
        ),
        (
            FIXTURES / "q4_v1.smoe",
            "arch.model_type",
            "--field arch.model_type: no such field (arch is null)",
        ),
        (
            Q4,
            "header..bits",
            "--field header..bits: not a field name (a dotted path such as "
            "header.num_moe_layers, arch.model_type or experts[0].tensors[2].rows)",
        ),
    ],
)
def test_an_unknown_field_is_a_usage_error(
    vault: Path, name: str, message: str, capsys: pytest.CaptureFixture
) -> None:
    assert in_process(capsys, "dump", vault, "--field", name) == (2, "", f"error: {message}\n")
    code, out, err = in_process(capsys, "dump", vault, "--field", name, "--json")
    assert (code, err) == (2, f"error: {message}\n")
    assert strict_json(out) == {
        "schema": "smoe-findings/1",
        "ok": False,
        "error": {"message": message, "exit_code": 2},
    }


def test_an_unknown_field_exits_2_from_both_commands() -> None:
    message = (
        "error: --field header.num_layers: no such field (nearest: header.num_moe_layers, "
        "header.max_experts_per_layer, header.version)"
    )
    assert refused(run("dump", Q4, "--field", "header.num_layers"), 2) == message
    assert refused(run(Q4, "--field", "header.num_layers", command=SMOE_DUMP), 2) == message


def test_a_vault_without_a_header_has_no_header_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    short = tmp_path / "short.smoe"
    shutil.copyfile(Q4, short)
    with short.open("r+b") as f:
        f.truncate(10)
    assert in_process(capsys, "dump", short, "--field", "header.bits") == (
        2,
        "",
        "error: --field header.bits: no such field (header is null)\n",
    )
    assert in_process(capsys, "dump", short, "--field", "file.size") == (2, "10\n", "")
