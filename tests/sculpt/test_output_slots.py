"""Output names and slots are checked before the first expert is quantised (issue 23, 10).

A stem too long for the file system once the temporary suffix is added, or a folder where
the scout goes, used to fail at the commit, after every expert had been quantised (and the
partial was deleted). Now both are refused at once: one line, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from smoe.errors import SmoeError, UsageError
from smoe.sculpt import SculptOptions, sculpt

from fixtures_data import CKPTS


def test_a_name_too_long_for_the_file_system_is_refused_first(tmp_path: Path) -> None:
    out = tmp_path / "out"
    stem = "s" * 236  # the scout's name (254 bytes) fits alone, not with the ".tmp" suffix
    with pytest.raises(UsageError) as e:
        sculpt(CKPTS / "qwen3_moe", out, SculptOptions(name=stem, jobs=1))
    scout = out / f"{stem}.scout.safetensors"
    assert str(e.value) == (
        f"{scout}: its name is {len(stem) + 18 + 14} bytes with the temporary suffix a write "
        "adds ('.<name>.<8 hex>.tmp'), more than the 255 bytes this file system allows in "
        "a name; choose a shorter --name"
    )
    assert not out.exists() or list(out.iterdir()) == []


def test_a_folder_where_the_scout_goes_is_refused_first(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "qwen3_moe.scout.safetensors").mkdir(parents=True)
    with pytest.raises(SmoeError) as e:
        sculpt(CKPTS / "qwen3_moe", out, SculptOptions(jobs=1))
    assert str(e.value) == (
        f"{out / 'qwen3_moe.scout.safetensors'}: exists and is not a regular file (a folder); "
        "refusing to replace it"
    )
    assert sorted(p.name for p in out.iterdir()) == ["qwen3_moe.scout.safetensors"]
