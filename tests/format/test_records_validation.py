"""Issue 23 item 2: every value that reaches an arch block is checked where its bytes are
made (``smoe.format.records``), so no command writes a vault the verifier rejects.

``model_type`` is 1 to 24 printable ASCII characters; anything else is refused, never cut,
before anything is written: by ``sculpt`` (nothing under OUT_DIR) and by ``upgrade``
(the vault byte for byte as it was).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from smoe.format.records import ArchInfo, arch_record, metadata_bytes, model_type_problem

from fixtures_data import CKPTS, FIXTURES
from fixtures_data import OLMOE_ARCH as ARCH
from fixtures_data import OLMOE_CONFIG as CONFIG
from helpers import refused, run

RULE = "it must be 1 to 24 printable ASCII characters"
# (model_type as config.json holds it, its JSON spelling, what is wrong with it)
BAD = [
    ("a\u0000b", '"a\\u0000b"', "has U+0000 at character 1"),
    ("y" * 30, '"' + "y" * 30 + '"', "is 30 characters long"),
    ("qwén", '"qw\\u00e9n"', "has U+00E9 at character 2"),
    ("", '""', "is empty"),
    ("qwen\t3", '"qwen\\t3"', "has U+0009 at character 4"),
    ("\x1b[31mred", '"\\u001b[31mred"', "has U+001B at character 0"),
    ("x\x7f", '"x\\u007f"', "has U+007F at character 1"),
    ("olmoe\n", '"olmoe\\n"', "has U+000A at character 5"),
]
IDS = ["nul", "30-chars", "non-ascii", "empty", "tab", "escape", "del", "newline"]


@pytest.mark.parametrize(("name", "spelled", "why"), BAD, ids=IDS)
def test_arch_info_refuses_model_type(name: str, spelled: str, why: str) -> None:
    arch = replace(ARCH, model_type=name)
    want = f"arch.model_type: {spelled} {why}; {RULE}"
    assert refused(arch.check) == want
    assert refused(lambda: arch_record(arch)) == want  # where the bytes are made
    assert model_type_problem(name) == f"{why}; {RULE}"


def test_arch_info_keeps_valid_model_types() -> None:
    for name in ("olmoe", "q" * 24, " !~", "deepseek_v3", "llama4_text"):
        block = arch_record(replace(ARCH, model_type=name))
        assert bytes(block.tobytes()[60:84]) == name.encode().ljust(24, b"\0")
    assert refused(lambda: replace(ARCH, model_type=b"olmoe").check()) == (
        "arch.model_type: b'olmoe' is not a string"
    )


def test_metadata_bytes_refuses_a_bad_arch() -> None:
    from smoe.format.plan import make_plan
    from smoe.format.records import ModelInfo

    plan = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, bits=4, version=2)
    model = ModelInfo(1, 1, d_model=64, vocab_size=0, ffn_dim=0)
    bad = replace(ARCH, model_type="a\u0000b")
    assert refused(lambda: metadata_bytes(plan, model, bad)).startswith("arch.model_type: ")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rope_theta", "1e6", "arch.rope_theta: '1e6' is not a number"),
        ("rms_norm_eps", None, "arch.rms_norm_eps: None is not a number"),
    ],
)
def test_arch_info_refuses_floats_of_another_type(field: str, value: object, message: str) -> None:
    assert refused(replace(ARCH, **{field: value}).check) == message


def _checkpoint(tmp_path: Path, model_type: str) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(CKPTS / "qwen3_moe", ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["model_type"] = model_type
    (ck / "config.json").write_text(json.dumps(cfg))
    return ck


@pytest.mark.parametrize(("name", "spelled", "why"), BAD, ids=IDS)
def test_sculpt_refuses_model_type(tmp_path: Path, name: str, spelled: str, why: str) -> None:
    ck = _checkpoint(tmp_path, name)
    out = tmp_path / "out"
    line = refused(["sculpt", ck, out], 1, unchanged=[ck], absent=out)
    assert line == f"error: {ck / 'config.json'}: model_type {spelled} {why}; {RULE}"


def test_sculpt_dry_run_refuses_model_type(tmp_path: Path) -> None:
    ck = _checkpoint(tmp_path, "a\u0000b")
    out = tmp_path / "out"
    line = refused(["sculpt", ck, out, "--dry-run"], 1, unchanged=[ck], absent=out)
    assert line.endswith(f'model_type "a\\u0000b" has U+0000 at character 1; {RULE}')


@pytest.mark.parametrize("fixture", ["q4_v1.smoe", "q4_v2.smoe"])
@pytest.mark.parametrize(("name", "spelled", "why"), BAD[:3], ids=IDS[:3])
def test_upgrade_refuses_model_type(
    tmp_path: Path, fixture: str, name: str, spelled: str, why: str
) -> None:
    vault = tmp_path / "v" / fixture
    vault.parent.mkdir()
    shutil.copy(FIXTURES / fixture, vault)
    shutil.copy(FIXTURES / f"{fixture}.manifest.json", vault.parent)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**CONFIG, "model_type": name}))
    line = refused(["upgrade", vault, "--force", "--config", cfg], 1, unchanged=[vault.parent, cfg])
    assert line == f"error: {cfg}: model_type {spelled} {why}; {RULE}"


def test_upgrade_api_refuses_before_touching_the_vault(tmp_path: Path) -> None:
    from smoe.vault.upgrade import upgrade

    vault = tmp_path / "v" / "q4_v2.smoe"
    vault.parent.mkdir()
    shutil.copy(FIXTURES / "q4_v2.smoe", vault)
    bad: ArchInfo = replace(ARCH, model_type="y" * 25)
    line = refused(lambda: upgrade(vault, bad, force=True), unchanged=[vault.parent])
    assert line == f'arch.model_type: "{"y" * 25}" is 25 characters long; {RULE}'
    out = tmp_path / "new.smoe"
    assert refused(lambda: upgrade(vault, bad, out=out), unchanged=[vault.parent]) == line
    assert not out.exists()


def test_valid_model_type_sculpts_and_verifies(tmp_path: Path) -> None:
    ck = _checkpoint(tmp_path, "q" * 24)  # exactly the field: no NUL, nothing cut
    out = tmp_path / "out"
    proc = run("sculpt", ck, out, "--jobs", "1")
    assert proc.returncode == 0, proc.stderr
    vault = out / "ck.smoe"
    assert run("verify", vault).returncode == 0
    from smoe.vault.reader import Vault

    with Vault.open(vault) as v:
        assert v.arch is not None and bytes(v.arch["model_type"]) == b"q" * 24
