"""``--calibrate DATA``: token ids from .npy, .safetensors or text, shaped into sequences,
every id checked against the vocabulary, every bad file refused in one line naming it.

Text is tokenised with a real tokenizer written into the test's folder (a WordLevel model of
the ``tokenizers`` library with a fixed vocabulary, loaded by ``AutoTokenizer``): no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from smoe.errors import MissingExtra, RefusedInput, SmoeError, UnreadableInput, UsageError
from smoe.sculpt.calibrate import data as calib
from smoe.sculpt.calibrate.data import MAX_BYTES, CalibrationData, load_calibration

V = 1000  # the vocabulary size of the tests' "model"


def load(path: Path, **kw: object) -> CalibrationData:
    args: dict = {"vocab_size": V, "model_dir": path.parent, **kw}
    return load_calibration(path, **args)


def refusal(kind: type[SmoeError], path: Path, **kw: object) -> str:
    """The one-line message of the refusal of ``path``, of exactly the kind ``kind``."""
    with pytest.raises(SmoeError) as info:
        load(path, **kw)
    exact = type(info.value) is kind
    assert exact or (kind is UnreadableInput and isinstance(info.value, kind)), info.value
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    return text


def npy(tmp_path: Path, arr: np.ndarray, name: str = "ids.npy") -> Path:
    path = tmp_path / name
    with open(path, "wb") as f:  # np.save(NAME) would add ".npy" to "IDS.NPY"
        np.save(f, arr, allow_pickle=arr.dtype.hasobject)
    return path


def st(tmp_path: Path, tensors: dict[str, np.ndarray], name: str = "ids.safetensors") -> Path:
    path = tmp_path / name
    save_file(tensors, str(path))
    return path


# ---- shaping -----------------------------------------------------------------------------
def test_1d_ids_are_cut_into_windows_and_the_remainder_dropped(tmp_path: Path) -> None:
    data = load(npy(tmp_path, np.arange(10)), seq_len=4)
    assert data.ids.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert data.tokens == 8
    assert load(npy(tmp_path, np.arange(12)), seq_len=4).ids.shape == (3, 4)


def test_a_short_1d_remainder_is_kept_when_it_is_the_only_window(tmp_path: Path) -> None:
    data = load(npy(tmp_path, np.arange(5)), seq_len=512)
    assert data.ids.tolist() == [[0, 1, 2, 3, 4]]
    assert load(npy(tmp_path, np.array([7, 9])), seq_len=2).ids.tolist() == [[7, 9]]


def test_2d_rows_are_the_sequences_whatever_seq_len_says(tmp_path: Path) -> None:
    arr = np.arange(15).reshape(3, 5)
    for seq_len in (2, 4, 512):
        assert load(npy(tmp_path, arr), seq_len=seq_len).ids.tolist() == arr.tolist()


def test_max_tokens_keeps_the_first_whole_sequences_and_at_least_one(tmp_path: Path) -> None:
    path = npy(tmp_path, np.arange(20).reshape(4, 5))
    assert load(path, max_tokens=14).ids.tolist() == [list(range(5)), list(range(5, 10))]
    assert load(path, max_tokens=15).ids.shape == (3, 5)
    assert load(path, max_tokens=3).ids.tolist() == [list(range(5))]  # at least one
    assert load(path, max_tokens=10**9).ids.shape == (4, 5)
    one_d = npy(tmp_path, np.arange(100), "flat.npy")
    assert load(one_d, seq_len=8, max_tokens=20).ids.tolist() == [
        list(range(8)),
        list(range(8, 16)),
    ]


@pytest.mark.parametrize(
    "dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", ">i4"]
)
def test_every_integer_dtype_becomes_an_int64_copy(tmp_path: Path, dtype: str) -> None:
    arr = np.array([[0, 1, 2, 127], [5, 6, 7, 8]], dtype=dtype)
    data = load(npy(tmp_path, arr))
    assert data.ids.dtype == np.int64 and data.ids.flags.c_contiguous
    assert data.ids.flags.owndata and data.ids.flags.writeable
    assert type(data.ids) is np.ndarray  # not a view of the file's map
    assert data.ids.tolist() == arr.tolist()


def test_a_fortran_order_array_comes_back_in_c_order(tmp_path: Path) -> None:
    arr = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    data = load(npy(tmp_path, arr))
    assert data.ids.flags.c_contiguous and data.ids.tolist() == arr.tolist()


def test_the_ids_do_not_change_with_the_file(tmp_path: Path) -> None:
    path = npy(tmp_path, np.arange(8, dtype=np.int64))
    data = load(path)
    path.write_bytes(path.read_bytes()[:-8] + b"\xff" * 8)  # in place, same inode
    assert data.ids.tolist() == [list(range(8))]


def test_sha256_size_and_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calib, "_HASH_CHUNK", 7)  # the chunked hash, its last piece short
    path = npy(tmp_path, np.arange(30, dtype=np.int16), "calib.npy")
    raw = path.read_bytes()
    data = load(path, seq_len=8)
    assert data.sha256 == hashlib.sha256(raw).hexdigest()
    assert data.size == len(raw) and data.path == path and data.format == "npy"
    record = data.record()
    assert record == {
        "file": "calib.npy",
        "format": "npy",
        "bytes": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "sequences": 3,
        "seq_len": 8,
        "tokens": 24,
    }
    assert json.loads(json.dumps(record)) == record
    assert all(type(record[k]) is int for k in ("bytes", "sequences", "seq_len", "tokens"))


def test_the_extension_is_matched_whatever_its_case(tmp_path: Path) -> None:
    assert load(npy(tmp_path, np.arange(4), "IDS.NPY")).format == "npy"


# ---- .safetensors ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"])
def test_safetensors_input_ids_of_every_integer_dtype(tmp_path: Path, dtype: str) -> None:
    arr = np.array([[3, 1, 4, 1], [5, 9, 2, 6]], dtype=dtype)
    path = st(tmp_path, {"attention_mask": np.ones((2, 4), np.int8), "input_ids": arr})
    data = load(path)
    assert data.format == "safetensors" and data.ids.dtype == np.int64
    assert data.ids.tolist() == arr.tolist()
    assert data.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_safetensors_1d_input_ids_are_windowed(tmp_path: Path) -> None:
    path = st(tmp_path, {"input_ids": np.arange(11, dtype=np.int32)})
    assert load(path, seq_len=5).ids.tolist() == [list(range(5)), list(range(5, 10))]


def test_safetensors_without_input_ids(tmp_path: Path) -> None:
    two = st(tmp_path, {"ids": np.arange(4), "mask": np.ones(4, np.int8)}, "two.safetensors")
    assert refusal(RefusedInput, two) == (
        f"{two}: no tensor 'input_ids' (it has 'ids', 'mask'); token ids go in input_ids"
    )
    many = st(tmp_path, {f"t{i}": np.arange(2) for i in range(8)}, "many.safetensors")
    assert refusal(RefusedInput, many) == (
        f"{many}: no tensor 'input_ids' (it has 't0', 't1', 't2', 't3', 't4' and 3 more); "
        "token ids go in input_ids"
    )
    none = tmp_path / "none.safetensors"
    none.write_bytes(struct.pack("<Q", 2) + b"{}")
    assert refusal(RefusedInput, none) == (
        f"{none}: no tensor 'input_ids' (it has no tensors); token ids go in input_ids"
    )


@pytest.mark.parametrize(
    "arr, name",
    [
        (np.zeros(4, np.float32), "F32"),
        (np.zeros(4, np.float16), "F16"),
        (np.zeros(4, bool), "BOOL"),
    ],
)
def test_safetensors_input_ids_must_be_integers(tmp_path: Path, arr: np.ndarray, name: str) -> None:
    path = st(tmp_path, {"input_ids": arr})
    assert refusal(RefusedInput, path) == f"{path}: token ids must be integers, got {name}"


def test_safetensors_input_ids_of_three_dimensions(tmp_path: Path) -> None:
    path = st(tmp_path, {"input_ids": np.zeros((2, 2, 3), np.int64)})
    assert refusal(RefusedInput, path) == (
        f"{path}: token ids must be 1-D or 2-D, got 3 dimensions (shape [2, 2, 3])"
    )


def test_truncated_or_garbage_safetensors(tmp_path: Path) -> None:
    good = st(tmp_path, {"input_ids": np.arange(64, dtype=np.int64)}).read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good[:-100])
    assert refusal(RefusedInput, cut) == (
        f"{cut}: tensor 'input_ids' data ends at offset {len(good)}, beyond the end of the "
        f"file ({len(good) - 100} bytes)"
    )
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"abc")
    assert refusal(RefusedInput, tiny) == (
        f"{tiny}: not a safetensors file (3 bytes, shorter than the 8-byte header length)"
    )
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 64)  # a header length of 2^64 - 1
    assert "header length" in refusal(RefusedInput, junk)


# ---- .npy refusals -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "arr, name",
    [
        (np.zeros(4, np.float32), "float32"),
        (np.zeros(4, np.float64), "float64"),
        (np.zeros(4, bool), "bool"),
        (np.zeros(4, np.complex64), "complex64"),
        (np.array([1, 2], dtype=object), "object"),
        (np.array(["12", "34"]), "str64"),
    ],
)
def test_npy_ids_must_be_integers(tmp_path: Path, arr: np.ndarray, name: str) -> None:
    path = npy(tmp_path, arr)
    assert refusal(RefusedInput, path) == f"{path}: token ids must be integers, got {name}"


def test_npy_of_more_than_two_dimensions_or_none(tmp_path: Path) -> None:
    three = npy(tmp_path, np.zeros((2, 3, 4), np.int32), "three.npy")
    assert refusal(RefusedInput, three) == (
        f"{three}: token ids must be 1-D or 2-D, got 3 dimensions (shape [2, 3, 4])"
    )
    scalar = npy(tmp_path, np.array(5), "scalar.npy")
    assert refusal(RefusedInput, scalar) == (
        f"{scalar}: token ids must be 1-D or 2-D, got 0 dimensions (shape [])"
    )


def test_npy_without_ids(tmp_path: Path) -> None:
    empty = npy(tmp_path, np.zeros(0, np.int32))
    assert refusal(RefusedInput, empty) == f"{empty}: no token ids (shape [0])"
    rows = npy(tmp_path, np.zeros((3, 0), np.int32), "rows.npy")
    assert refusal(RefusedInput, rows) == f"{rows}: no token ids (shape [3, 0])"


def test_truncated_npy_is_refused_before_anything_is_mapped(tmp_path: Path) -> None:
    path = npy(tmp_path, np.arange(1000, dtype=np.int64))
    path.write_bytes(path.read_bytes()[:1000])
    assert refusal(RefusedInput, path) == (
        f"{path}: .npy file truncated: shape [1000] of int64 needs 8000 bytes after the "
        "128-byte header, the file holds 872"
    )


def test_a_header_claiming_a_huge_array_allocates_nothing(tmp_path: Path) -> None:
    path = npy(tmp_path, np.arange(4, dtype=np.int64))
    raw = path.read_bytes().replace(b"(4,)", b"(10000000000000,)")
    path.write_bytes(raw.replace(b" " * 13 + b"\n", b"\n", 1))  # keep the header's length
    text = refusal(RefusedInput, path)
    assert text.startswith(f"{path}: .npy file truncated: shape [10000000000000] of int64")


def test_npy_with_bytes_after_its_data(tmp_path: Path) -> None:
    path = npy(tmp_path, np.arange(4, dtype=np.int8))
    path.write_bytes(path.read_bytes() + b"junk")
    assert refusal(RefusedInput, path) == (
        f"{path}: .npy file has bytes after its data: shape [4] of int8 needs 4 bytes after "
        "the 128-byte header, the file holds 8"
    )


def test_garbage_npy(tmp_path: Path) -> None:
    path = tmp_path / "ids.npy"
    path.write_bytes(b"PK\x03\x04 not numpy at all")
    assert refusal(RefusedInput, path) == (
        f"{path}: not a .npy file (it does not begin with \\x93NUMPY)"
    )
    path.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': garbage")
    assert refusal(RefusedInput, path).startswith(f"{path}: not a readable .npy file: ")
    path.write_bytes(b"\x93NUMPY\x09\x00")
    assert refusal(RefusedInput, path).startswith(f"{path}: not a readable .npy file: ")


# ---- ids outside the vocabulary ----------------------------------------------------------
def test_an_id_at_or_above_vocab_size_is_named_by_its_position(tmp_path: Path) -> None:
    arr = np.zeros((3, 4), np.int32)
    arr[1, 2], arr[2, 0] = V, V + 5
    path = npy(tmp_path, arr)
    assert refusal(RefusedInput, path) == (
        f"{path}: token id 1000 at [1, 2] is out of range: ids must be in 0..999 (vocab_size 1000)"
    )
    assert load(path, vocab_size=V + 6).ids.shape == (3, 4)


def test_a_negative_id_in_1d_ids_is_named_by_its_index(tmp_path: Path) -> None:
    path = npy(tmp_path, np.array([5, 6, 7, -3, 8], np.int16))
    assert refusal(RefusedInput, path) == (
        f"{path}: token id -3 at index 3 is out of range: ids must be in 0..999 (vocab_size 1000)"
    )


def test_ids_are_checked_in_chunks_and_in_the_dropped_remainder_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calib, "_SCAN_CHUNK", 4)
    arr = np.arange(23, dtype=np.int64)
    arr[22] = 2**40  # in the remainder that windows of 4 drop
    path = npy(tmp_path, arr)
    assert refusal(RefusedInput, path, seq_len=4).startswith(
        f"{path}: token id 1099511627776 at index 22 is out of range"
    )
    rows = np.zeros((9, 3), np.int32)
    rows[7, 1] = -1
    two = npy(tmp_path, rows, "rows.npy")
    assert refusal(RefusedInput, two, max_tokens=3).startswith(
        f"{two}: token id -1 at [7, 1] is out of range"
    )


def test_a_uint64_id_beyond_int64_is_refused_not_wrapped(tmp_path: Path) -> None:
    path = npy(tmp_path, np.array([1, 2**64 - 1], np.uint64))
    assert refusal(RefusedInput, path).startswith(
        f"{path}: token id 18446744073709551615 at index 1 is out of range"
    )


def test_sequences_need_two_tokens(tmp_path: Path) -> None:
    one = npy(tmp_path, np.array([4]), "one.npy")
    assert refusal(RefusedInput, one) == f"{one}: 1 token; a sequence needs at least 2 tokens"
    col = npy(tmp_path, np.zeros((3, 1), np.int32), "col.npy")
    assert refusal(RefusedInput, col) == (
        f"{col}: sequences of 1 token (shape [3, 1]); a sequence needs at least 2 tokens"
    )


# ---- files that are not DATA -------------------------------------------------------------
def test_an_empty_file(tmp_path: Path) -> None:
    for name in ("e.npy", "e.safetensors", "e.txt"):
        path = tmp_path / name
        path.write_bytes(b"")
        assert refusal(RefusedInput, path) == f"{path}: empty file, no token ids"


def test_a_file_over_the_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.npy"
    with open(path, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: no disk, and nothing of it is read
    assert refusal(RefusedInput, path) == (
        f"{path}: {MAX_BYTES + 1} bytes, more than the 4 GiB a calibration DATA file may have"
    )


def test_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "ids.npy"
    folder.mkdir()
    assert refusal(UnreadableInput, folder) == f"{folder}: not a regular file (a folder)"


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "gone.npy"
    assert refusal(UnreadableInput, path) == f"{path}: cannot open: No such file or directory"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no os.mkfifo on this platform")
@pytest.mark.parametrize("name", ["ids.txt", "ids.npy", "ids.safetensors"])
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, name: str) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    fifo = tmp_path / name
    os.mkfifo(fifo)
    out: list[BaseException] = []

    def call() -> None:
        try:
            load(fifo)
        except BaseException as e:
            out.append(e)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "blocked on the FIFO"
    assert isinstance(out[0], UnreadableInput)
    assert str(out[0]) == f"{fifo}: not a regular file (a FIFO)"


@pytest.mark.parametrize(
    "kw, text",
    [
        ({"seq_len": 1}, "seq_len must be an integer >= 2, got 1"),
        ({"seq_len": 0}, "seq_len must be an integer >= 2, got 0"),
        ({"seq_len": True}, "seq_len must be an integer >= 2, got True"),
        ({"seq_len": 4.0}, "seq_len must be an integer >= 2, got 4.0"),
        ({"vocab_size": 0}, "vocab_size must be an integer >= 1, got 0"),
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
    ],
)
def test_bad_numbers_are_usage_errors_before_the_file_is_opened(
    tmp_path: Path, kw: dict, text: str
) -> None:
    path = tmp_path / "not-there.npy"  # never opened: the numbers are refused first
    assert refusal(UsageError, path, **kw) == f"{path}: {text}"


def test_numpy_integers_are_numbers_too(tmp_path: Path) -> None:
    path = npy(tmp_path, np.arange(9))
    data = load(path, seq_len=np.int64(3), vocab_size=np.int32(9), max_tokens=np.uint8(6))
    assert data.ids.shape == (2, 3)


# ---- text --------------------------------------------------------------------------------
WORDS = ["[UNK]", "<s>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "é", "."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint folder holding only a tokenizer: WordLevel over WORDS (ids in order),
    split on whitespace and punctuation, with ``<s>`` prepended as the special token."""
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("model")
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    tok.save(str(root / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>"}
    config["unk_token"] = "[UNK]"
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def text_file(tmp_path: Path, content: str | bytes, name: str = "calib.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def test_text_is_tokenised_by_the_checkpoints_tokenizer(tmp_path: Path, model_dir: Path) -> None:
    from transformers import AutoTokenizer

    text = "the cat sat on the mat. a dog ran on the mat. the cat ran"
    path = text_file(tmp_path, text)
    data = load_calibration(path, vocab_size=len(WORDS), model_dir=model_dir, seq_len=4)
    want = AutoTokenizer.from_pretrained(str(model_dir)).encode(text, add_special_tokens=False)
    assert want[:6] == [2, 3, 4, 5, 2, 6]  # no <s> (1) in front
    assert len(want) == 17  # the two "." are tokens too
    assert data.ids.tolist() == [want[0:4], want[4:8], want[8:12], want[12:16]]
    assert data.format == "text" and data.ids.dtype == np.int64
    assert data.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert data.record()["format"] == "text" and data.record()["tokens"] == 16


def test_text_shorter_than_seq_len_and_a_byte_order_mark(tmp_path: Path, model_dir: Path) -> None:
    path = text_file(tmp_path, "\ufeffa dog é sat")
    data = load_calibration(path, vocab_size=len(WORDS), model_dir=model_dir)
    assert data.ids.tolist() == [[7, 8, 10, 4]]


def test_text_ids_outside_the_vocabulary(tmp_path: Path, model_dir: Path) -> None:
    path = text_file(tmp_path, "the cat sat on a dog")
    text = refusal(RefusedInput, path, model_dir=model_dir, vocab_size=8)
    assert text == (
        f"{path}: token id 8 at index 5 is out of range: ids must be in 0..7 (vocab_size 8)"
    )


def test_text_that_tokenises_to_nothing(tmp_path: Path, model_dir: Path) -> None:
    path = text_file(tmp_path, " \n\t ")
    assert refusal(RefusedInput, path, model_dir=model_dir) == (
        f"{path}: no tokens: the text tokenises to nothing"
    )


def test_text_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")  # not reached: the bytes fail first
    path = text_file(tmp_path, b"the cat \xff sat")
    assert refusal(RefusedInput, path) == (
        f"{path}: not UTF-8 text: byte 0xff at offset 8 (invalid start byte); token ids go "
        "in .npy or .safetensors"
    )
    cut = text_file(tmp_path, "caf\u00e9".encode()[:-1], "cut.txt")
    assert refusal(RefusedInput, cut) == (
        f"{cut}: not UTF-8 text: byte 0xc3 at offset 3 (unexpected end of data); token ids go "
        "in .npy or .safetensors"
    )


def test_binary_ids_under_a_text_name(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    path = text_file(tmp_path, np.arange(4, dtype=np.int32).tobytes(), "ids.bin")
    assert refusal(RefusedInput, path) == (
        f"{path}: not text: a NUL byte at offset 0; token ids go in .npy or .safetensors"
    )


def test_text_without_tokenizer_files(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    path = text_file(tmp_path, "the cat sat")
    assert refusal(RefusedInput, path, model_dir=model) == (
        f"{path}: text needs the checkpoint's tokenizer, and {model} has no tokenizer files; "
        "give token ids instead (.npy, or .safetensors with input_ids)"
    )


def test_text_without_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers: ImportError
    path = text_file(tmp_path, "the cat sat")
    assert refusal(MissingExtra, path) == (
        f"{path}: text DATA is tokenised with transformers, which is not installed: "
        "pip install 'smoe[calibrate]'"
    )


def test_a_tokenizer_that_cannot_be_loaded(tmp_path: Path, model_dir: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("this is not json")
    (broken / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    path = text_file(tmp_path, "the cat sat")
    assert refusal(RefusedInput, path, model_dir=broken).startswith(
        f"{path}: the tokenizer of {broken} cannot be loaded: "
    )
