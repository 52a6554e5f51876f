"""The reader in the names users know (issue 25): HF tensor names as ``export --hf`` writes
them (``tensor_names``, ``get_tensor``, as safetensors' ``safe_open``), the vault as a
``Mapping`` of ``(layer, expert)``, clear errors for keys of other forms, and the header and
arch block as dicts of plain values."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from smoe.errors import RefusedInput, SmoeError
from smoe.export.hf import names as export_names
from smoe.export.hf.checkpoint import export_hf
from smoe.format import manifest
from smoe.sculpt import SculptOptions, sculpt
from smoe.vault import names
from smoe.vault.fields import Fields, FieldText
from smoe.vault.reader import ExpertView, Vault
from smoe_gen import layout

from fixtures_data import CKPTS, FIXTURES
from helpers import run

Q4 = FIXTURES / "q4_v2.smoe"
WHOLE = ["q4_v2", "q2_v2", "q4_v1", "qwen3_v2", "deepseek_v2", "noroom_v1"]  # export takes these
SCULPTED = ["mixtral", "qwen3_moe", "qwen3_moe_fused", "deepseek_v2", "qwen3_moe_sharded"]


# ---- helpers --------------------------------------------------------------------------------
def staged(name: str, folder: Path, router: str = "mlp.gate") -> Path:
    """A copy of fixture vault ``name`` and its manifest in ``folder``, with a scout beside
    it (embedding, a tensor of each layer, each MoE layer's router as ``router``) and a
    config.json copy that agrees with it: what ``export --hf`` needs."""
    folder.mkdir()
    for suffix in (".smoe", ".smoe.manifest.json"):
        shutil.copy(FIXTURES / f"{name}{suffix}", folder / f"{name}{suffix}")
    vault = folder / f"{name}.smoe"
    with Vault.open(vault) as v:
        h, a = v.header, v.arch
        count = max(v.layers()) + 1 if a is None else a["num_hidden_layers"]
        d_model = h["d_model"]
        scout = {"model.embed_tokens.weight": np.zeros((h["vocab_size"], d_model), np.float32)}
        for i in range(count):
            scout[f"model.layers.{i}.input_layernorm.weight"] = np.zeros(d_model, np.float32)
        for i in v.layers():
            shape = (h["max_experts_per_layer"], d_model)
            scout[f"model.layers.{i}.{router}.weight"] = np.zeros(shape, np.float32)
        model_type = "olmoe" if a is None else a["model_type"]
    save_file(scout, folder / f"{name}.scout.safetensors")
    config = {"model_type": model_type, "hidden_size": d_model, "num_hidden_layers": count}
    (folder / f"{name}.config.json").write_text(json.dumps(config))
    return vault


def exported(vault: Path, out: Path) -> dict[str, np.ndarray]:
    """``export --hf --dtype f32`` of ``vault``: its expert tensors by name, as safetensors
    reads them (every shard's)."""
    export_hf(vault, out, dtype="f32", threads=1)
    with Vault.open(vault) as v:
        expert_names = set(v.tensor_names())
    found: dict[str, np.ndarray] = {}
    for shard in sorted(out.glob("*.safetensors")):
        with safe_open(shard, "np") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors file, not a dict)
                if name in expert_names:
                    found[name] = f.get_tensor(name)
    return found


def same_names(v: Vault, written: dict[str, np.ndarray]) -> None:
    """The reader's names are the ones written, in natural order (layer 2 before 10)."""
    assert set(v.tensor_names()) == set(written)
    assert v.tensor_names() == sorted(written, key=names.natural_key)


@pytest.fixture(scope="module")
def sculpted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """checkpoint name -> its Q4 vault (manifest with sources, scout, config), sculpted once."""
    base = tmp_path_factory.mktemp("mapping")
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = sculpt(CKPTS / name, base / name, SculptOptions(bits=4, jobs=1)).vault
        return done[name]

    return get


def copied(vault: Path, folder: Path) -> Path:
    """``vault`` with everything beside it, copied into ``folder``."""
    folder.mkdir()
    for p in vault.parent.iterdir():
        if p.is_file():
            shutil.copy(p, folder / p.name)
    return folder / vault.name


# ---- HF names: as export --hf writes them ---------------------------------------------------
def test_the_names_live_in_the_vault_layer_once() -> None:
    for name in export_names.__all__:
        assert getattr(export_names, name) is getattr(names, name), name


@pytest.mark.parametrize("name", WHOLE)
def test_fixture_vaults_name_tensors_as_export_writes_them(name: str, tmp_path: Path) -> None:
    vault = staged(name, tmp_path / "in")
    written = exported(vault, tmp_path / "hf")
    with Vault.open(vault) as v:
        same_names(v, written)
        assert len(written) == 3 * len(v)
        for n, w in written.items():
            got = v.get_tensor(n)
            assert got.dtype == np.float32 and got.shape == w.shape
            assert np.array_equal(got, w), n


def test_mixtral_routers_in_the_scout_give_mixtral_names(tmp_path: Path) -> None:
    vault = staged("q4_v2", tmp_path / "in", router="block_sparse_moe.gate")
    written = exported(vault, tmp_path / "hf")
    with Vault.open(vault) as v:
        same_names(v, written)
        assert v.tensor_names()[:3] == [
            "model.layers.0.block_sparse_moe.experts.0.w1.weight",
            "model.layers.0.block_sparse_moe.experts.0.w2.weight",
            "model.layers.0.block_sparse_moe.experts.0.w3.weight",
        ]
    # an array has nothing beside it: the arch block alone decides (olmoe's names)
    in_memory = Vault.from_array(np.fromfile(vault, np.uint8), vault)
    assert in_memory.tensor_names()[0] == "model.layers.0.mlp.experts.0.down_proj.weight"


@pytest.mark.parametrize("name", SCULPTED)
def test_manifest_sources_name_tensors_as_export_writes_them(
    name: str, sculpted: Callable[[str], Path], tmp_path: Path
) -> None:
    vault = sculpted(name)
    written = exported(vault, tmp_path / "hf")
    with Vault.open(vault) as v:
        same_names(v, written)
        for n, w in written.items():
            assert np.array_equal(v.get_tensor(n), w), n


def test_a_fused_tensor_is_every_experts_slab(sculpted: Callable[[str], Path]) -> None:
    with Vault.open(sculpted("qwen3_moe_fused")) as v:
        assert v.tensor_names() == [
            "model.layers.0.mlp.experts.down_proj",
            "model.layers.0.mlp.experts.gate_up_proj",
            "model.layers.1.mlp.experts.down_proj",
            "model.layers.1.mlp.experts.gate_up_proj",
        ]
        gate_up = v.get_tensor("model.layers.1.mlp.experts.gate_up_proj")
        down = v.get_tensor("model.layers.1.mlp.experts.down_proj")
        assert gate_up.shape == (8, 96, 64) and down.shape == (8, 64, 48)
        for e in range(8):
            w = v[1, e].dequantize()
            assert np.array_equal(gate_up[e], np.concatenate([w["gate_proj"], w["up_proj"]]))
            assert np.array_equal(down[e], w["down_proj"])


def renamed_model_type(vault: Path, model_type: str) -> None:
    """Set the model type of ``vault``'s arch block and of its config copy."""
    with Vault.open(vault) as v:
        at = int(v.header["reserved_ext"]) + layout.ARCH_BLOCK_OFFSETS["model_type"]
    raw = bytearray(vault.read_bytes())
    raw[at : at + layout.MODEL_TYPE_SIZE] = model_type.encode().ljust(layout.MODEL_TYPE_SIZE, b"\0")
    vault.write_bytes(bytes(raw))
    config = vault.with_name(vault.name.removesuffix(".smoe") + ".config.json")
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": model_type}))


def test_a_transposed_source_is_written_transposed(
    sculpted: Callable[[str], Path], tmp_path: Path
) -> None:
    """The manifest edited as the sculptor records an [E, H, 2I] source, and the model type
    (arch block and config) made one the registry does not know: qwen3_moe's checkpoints have
    no transposed layout, and export refuses a manifest that says otherwise (issue #31)."""
    vault = copied(sculpted("qwen3_moe_fused"), tmp_path / "t")
    renamed_model_type(vault, "custom_moe")
    path = manifest.path_for(vault)
    doc = json.loads(path.read_text())
    for row in doc["experts"]:  # as the sculptor records an [E, H, 2I] source
        for t in row["tensors"]:
            t["transposed"] = True
    path.write_text(json.dumps(doc))
    written = exported(vault, tmp_path / "hf")
    with Vault.open(vault) as v:
        same_names(v, written)
        gate_up = v.get_tensor("model.layers.0.mlp.experts.gate_up_proj")
        assert gate_up.shape == (8, 64, 96)
        assert np.array_equal(gate_up, written["model.layers.0.mlp.experts.gate_up_proj"])
        w = v[0, 5].dequantize()
        assert np.array_equal(gate_up[5], np.concatenate([w["gate_proj"], w["up_proj"]]).T)


def test_a_hub_layout_source_names_and_shapes_as_export_writes_it(tmp_path: Path) -> None:
    """A real ``[E, H, 2I]`` checkpoint (Qwen3-VL-MoE as the Hub holds it), not an edited
    manifest."""
    torch = pytest.importorskip("torch", reason="the hf extra is not installed")
    from safetensors.torch import load_file, save_file

    from smoe_testkit import tiny

    saved, hub = tmp_path / "saved", tmp_path / "hub"
    tiny.write("qwen3_vl_moe", saved)
    hub.mkdir()
    for f in saved.iterdir():
        if f.suffix != ".safetensors":
            (hub / f.name).write_bytes(f.read_bytes())
            continue
        tensors = load_file(f)
        for name, t in tensors.items():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                tensors[name] = torch.transpose(t, 1, 2).contiguous()
        save_file(tensors, hub / f.name, metadata={"format": "pt"})
    vault = sculpt(hub, tmp_path / "out", SculptOptions(bits=4, jobs=1)).vault
    written = exported(vault, tmp_path / "hf")
    with Vault.open(vault) as v:
        same_names(v, written)
        for n, w in written.items():
            assert np.array_equal(v.get_tensor(n), w), n
        gate_up = v.get_tensor("model.language_model.layers.0.mlp.experts.gate_up_proj")
        e = v[0, 1].dequantize()
        inter = e["gate_proj"].shape[0]
        assert gate_up.shape[1:] == (e["gate_proj"].shape[1], 2 * inter)  # [E, H, 2I]
        assert np.array_equal(gate_up[1][:, :inter], e["gate_proj"].T)


def test_a_partial_vault_names_what_it_holds() -> None:
    # export refuses partial vaults; the reader names the experts they hold
    with Vault.open(FIXTURES / "partial_groups.smoe") as v:
        got = v.tensor_names()
        assert len(got) == 3 * len(v)
        assert got[0] == "model.layers.0.mlp.experts.0.down_proj.weight"
        assert all(f".experts.{e}." in " ".join(got) for _, e in v)


def test_a_manifest_of_another_vault_is_refused_as_export_refuses_it(tmp_path: Path) -> None:
    vault = staged("q4_v2", tmp_path / "in")
    shutil.copy(FIXTURES / "noroom_v1.smoe.manifest.json", manifest.path_for(vault))
    with pytest.raises(RefusedInput) as by_export:
        export_hf(vault, tmp_path / "hf", threads=1)
    with Vault.open(vault) as v:
        with pytest.raises(RefusedInput) as by_reader:
            v.tensor_names()
        assert len(v) == 8 and v[0, 0].keys()  # the vault itself still reads
    assert str(by_reader.value) == str(by_export.value)
    assert str(by_reader.value) == (
        f"{manifest.path_for(vault)}: describes another vault (1490944 bytes, 90 experts; "
        f"{vault} has 147456 bytes, 8 experts)"
    )


def test_an_unknown_name_names_the_nearest() -> None:
    with Vault.open(Q4) as v:
        with pytest.raises(KeyError) as info:
            v.get_tensor("model.layers.1.mlp.experts.3.gate.weight")
        assert info.value.args[0] == (
            f"{Q4}: no tensor 'model.layers.1.mlp.experts.3.gate.weight'; nearest: "
            "'model.layers.1.mlp.experts.3.gate_proj.weight', "
            "'model.layers.1.mlp.experts.2.gate_proj.weight', "
            "'model.layers.1.mlp.experts.1.gate_proj.weight' "
            "(vault.tensor_names() lists all 24)"
        )
        with pytest.raises(KeyError) as info:
            v.get_tensor("lm_head.weight")  # a scout tensor is not the vault's
        assert info.value.args[0] == (
            f"{Q4}: no tensor 'lm_head.weight' (vault.tensor_names() lists all 24)"
        )
        with pytest.raises(TypeError) as wrong:
            v.get_tensor(3)  # type: ignore[arg-type]
        assert str(wrong.value) == (
            "a tensor name is a str, e.g. 'model.layers.0.mlp.experts.0.down_proj.weight'; got 3"
        )


def test_get_tensor_gives_a_new_array_each_time() -> None:
    with Vault.open(Q4) as v:
        name = v.tensor_names()[0]
        a, b = v.get_tensor(name), v.get_tensor(name)
        assert a is not b and np.array_equal(a, b) and a.flags.writeable


# ---- the vault as a Mapping of (layer, expert) ----------------------------------------------
def test_a_vault_is_a_mapping_of_experts() -> None:
    with Vault.open(Q4) as v:
        want = [(layer, expert) for layer in (0, 1) for expert in range(4)]
        assert isinstance(v, Mapping)
        assert len(v) == 8 and list(v) == want and v.keys() == want
        assert (1, 3) in v and (1, 4) not in v and "x" not in v
        values = v.values()
        assert len(values) == 8
        assert [(e.layer_id, e.expert_id) for e in values] == want
        assert [(e.layer_id, e.expert_id) for e in values] == want  # a view: iterates again
        assert [k for k, _ in v.items()] == want
        as_dict = dict(v)
        assert list(as_dict) == want and all(isinstance(e, ExpertView) for e in as_dict.values())


def test_values_read_experts_only_when_reached() -> None:
    v = Vault.open(Q4)
    v.close()
    values = v.values()  # nothing read yet
    assert len(values) == 8
    with pytest.raises(SmoeError, match=r"the file is closed$"):
        next(iter(values))


def test_get_is_in_then_getitem() -> None:
    with Vault.open(Q4) as v:
        e = v.get((1, 2))
        assert e is not None and (e.layer_id, e.expert_id) == (1, 2)
        assert v.get((1, 9)) is None and v.get((1, 9), "none") == "none"
        for key in ("x", 0, (0, slice(None)), (0, 1, 2)):  # other forms: not held
            assert v.get(key) is None and v.get(key, 7) == 7


def test_vaults_compare_by_identity_and_hash() -> None:
    with Vault.open(Q4) as a, Vault.open(Q4) as b:
        assert a == a and a != b  # comparing contents would read every expert
        assert len({a, b, a}) == 2


KEY_FORMS = "a vault is indexed by (layer, expert), e.g. vault[0, 1]; got "


@pytest.mark.parametrize(
    "key, message",
    [
        (0, "vault[0]: the experts of layer 0 are [k for k in vault if k[0] == 0]"),
        (
            np.int64(1),
            "vault[np.int64(1)]: the experts of layer 1 are [k for k in vault if k[0] == 1]",
        ),
        ("x", "vault['x']: a tensor by its HF name is vault.get_tensor('x')"),
        (
            (0, slice(None)),
            "vault[0, :]: slices are not supported (vault.keys() lists the (layer, expert) "
            "pairs it holds)",
        ),
        (
            (slice(1, 3), 0),
            "vault[1:3, 0]: slices are not supported (vault.keys() lists the (layer, expert) "
            "pairs it holds)",
        ),
        (
            slice(None, None, 2),
            "vault[::2]: slices are not supported (vault.keys() lists the (layer, expert) "
            "pairs it holds)",
        ),
        ((0, 1.0), "vault[0, 1.0]: layer and expert are integers, not float"),
        (("0", 1), "vault['0', 1]: layer and expert are integers, not str"),
        ((0, 1, 2), "vault[0, 1, 2]: two ids, not 3"),
        ((0,), "vault[0,]: two ids, not 1"),
        ((), "vault[()]: two ids, not 0"),
        (None, "vault[None]: two ids, not 1"),
    ],
)
def test_keys_of_other_forms_name_the_forms_a_vault_takes(key: object, message: str) -> None:
    with Vault.open(Q4) as v:
        with pytest.raises(TypeError) as info:
            v[key]  # type: ignore[index]
        assert str(info.value) == KEY_FORMS + message
        assert key not in v


def test_expert_and_index_take_integers_only() -> None:
    with Vault.open(Q4) as v:
        with pytest.raises(TypeError) as info:
            v.expert(0, slice(None))  # type: ignore[arg-type]
        assert str(info.value) == (
            KEY_FORMS + "vault[0, :]: slices are not supported (vault.keys() lists the "
            "(layer, expert) pairs it holds)"
        )
        with pytest.raises(TypeError) as info:
            v.index(0.5, 1)  # type: ignore[arg-type]
        assert (
            str(info.value) == KEY_FORMS + "vault[0.5, 1]: layer and expert are integers, not float"
        )
        assert v[np.uint32(1), np.int64(3)].expert_id == 3  # numpy integers are ids


# ---- header and arch block as dicts ---------------------------------------------------------
def test_header_and_arch_are_dicts_of_plain_values() -> None:
    with Vault.open(Q4) as v:
        h, a = v.header, v.arch
    assert isinstance(h, dict) and isinstance(a, dict)
    assert h == {
        "magic": layout.MAGIC.hex(),
        "version": 2,
        "num_moe_layers": 2,
        "max_experts_per_layer": 4,
        "total_experts": 8,
        "table_offset": 64,
        "data_offset": 16384,
        "group_size": 64,
        "bits": 4,
        "d_model": 64,
        "vocab_size": 320,
        "ffn_dim": 32,
        "reserved_ext": 1536,
    }
    assert {k: type(x) for k, x in h.items()} == {k: FieldText if k == "magic" else int for k in h}
    assert a["model_type"] == "olmoe" and type(a["model_type"]) is FieldText
    assert isinstance(a["model_type"], str) and repr(a["model_type"]) == "'olmoe'"
    assert (a["magic"], a["reserved"]) == (b"SARC".hex(), bytes(44).hex())
    assert (a["magic"], a["reserved"]) == (b"SARC", bytes(44))  # as bytes, as they were
    assert bytes(h["magic"]) == layout.MAGIC and h["magic"] == layout.MAGIC
    assert (a["rope_theta"], a["rms_norm_eps"]) == (10000.0, 1e-05)  # not 9.99999974737875e-06
    floats = {k for k, x in a.items() if type(x) is float}
    assert floats == {"rope_theta", "rms_norm_eps"}
    others = floats | {"magic", "reserved", "model_type"}
    assert all(type(x) is int for k, x in a.items() if k not in others)
    assert json.loads(json.dumps(h)) == h and json.loads(json.dumps(a)) == a


def test_header_and_arch_are_what_dump_json_prints() -> None:
    """One reading of a vault's fields: the Python dicts and ``dump --json`` agree key for
    key (byte arrays as hex), the arch block's floats compared as the float32 they are."""
    for name in ("q4_v2.smoe", "q2_v2.smoe", "q4_v1.smoe"):
        dump = json.loads(run("dump", "--json", FIXTURES / name).stdout)
        with Vault.open(FIXTURES / name) as v:
            h, a = v.header, v.arch
        assert json.loads(json.dumps(h)) == dump["header"], name
        if a is None:
            assert dump["arch"] is None, name
            continue
        shown = {k: x for k, x in dump["arch"].items() if k != "flag_names"}
        assert shown.keys() == a.keys(), name
        for k, x in shown.items():
            same = np.float32(x) == np.float32(a[k]) if isinstance(x, float) else x == a[k]
            assert same, (name, k)


def test_the_records_stay_available() -> None:
    with Vault.open(Q4) as v:
        assert isinstance(v.header_record, np.void) and isinstance(v.arch_record, np.void)
        assert v.header.record is v.header_record and v.arch.record is v.arch_record  # type: ignore[union-attr]
        assert v.header.dtype == layout.HEADER_DTYPE and v.header.dtype.names == tuple(v.header)
        for name in v.header:
            if name != "magic":
                assert v.header[name] == int(v.header_record[name]), name
        assert v.arch_record is not None
        assert np.float32(v.arch["rms_norm_eps"]) == v.arch_record["rms_norm_eps"]  # type: ignore[index]
    with Vault.open(FIXTURES / "q4_v1.smoe") as v1:
        assert v1.arch is None and v1.arch_record is None and v1.header["version"] == 1


def test_a_header_dict_is_new_each_time() -> None:
    with Vault.open(Q4) as v:
        h = v.header
        h["bits"] = 2
        assert v.header["bits"] == 4 and v.bits == 4 and v.header is not v.header


def test_model_type_still_answers_as_bytes() -> None:
    # code written when it was bytes: ==, .decode(), bytes()
    with Vault.open(Q4) as v:
        t = v.arch["model_type"]  # type: ignore[index]
    assert t == b"olmoe" and b"olmoe" == t  # noqa: SIM300 (both sides' methods)
    assert not t != b"olmoe" and t != b"mixtral"  # noqa: SIM202 (__ne__ itself)
    assert t.decode() == "olmoe" and bytes(t) == b"olmoe"
    assert t == "olmoe" and hash(t) == hash("olmoe") and {t: 1}["olmoe"] == 1


def test_float32_fields_read_back_exactly() -> None:
    rng = np.random.default_rng(25)
    values = np.concatenate(
        [
            rng.standard_normal(2000).astype(np.float32) * np.float32(1e-6),
            rng.uniform(1, 1e8, 2000).astype(np.float32),
            np.array([1e-6, 1e-5, 1e4, 1e6, 5e5, 0.0, 3.4e38, 1.4e-45], np.float32),
        ]
    )
    record = np.zeros(1, layout.ARCH_BLOCK_DTYPE)[0]
    for x in values:
        record["rms_norm_eps"] = x
        got = Fields(record)["rms_norm_eps"]
        assert type(got) is float and np.float32(got) == x, x
        assert len(repr(got)) <= len(repr(float(x)))  # never longer than the binary value's


def _arch_fixture() -> dict[str, Any]:
    return json.loads((FIXTURES / "MANIFEST.json").read_text())["q4_v2.smoe"]["arch"]


def test_arch_dict_agrees_with_the_fixture_manifest() -> None:
    want = _arch_fixture()
    with Vault.open(Q4) as v:
        got = v.arch
    assert got is not None
    for k, value in want.items():
        if k in ("magic", "reserved"):
            assert got[k].hex() == value, k
        elif isinstance(value, float):
            assert got[k] == pytest.approx(value, rel=1e-7), k
        else:
            assert got[k] == value, k
