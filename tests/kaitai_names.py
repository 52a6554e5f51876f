"""Read the generated Kaitai parser by the reference C header's field names.

The .ksy names its fields in kaitai_struct_formats style (`ofs_data`, `len_raw`, ...) and
records the reference header's name in `-orig-id` (`data_offset`, `raw_size`, ...), which the
numpy layout, smoe.Vault and the C++ header use. Tests that compare those with the Kaitai
parser field by field look the Kaitai attribute up here.
"""

from __future__ import annotations

from typing import Any

import yaml

from smoe_gen.smoe_kaitai import Smoe

from fixtures_data import ROOT

_SPEC = yaml.safe_load((ROOT / "spec" / "smoe.ksy").read_text(encoding="utf-8"))

#: reference header name -> .ksy id, for every field whose names differ (the same in every type)
KSY_ID: dict[str, str] = {
    a["-orig-id"]: a["id"]
    for node in _SPEC["types"].values()
    for a in node.get("seq", [])
    if "-orig-id" in a
}


def kaitai_field(obj: Any, name: str) -> Any:
    """The Kaitai object's value of the field the reference header calls ``name``; a
    NUL-padded UTF-8 name as its text."""
    value = getattr(obj, KSY_ID.get(name, name))
    return value.text if isinstance(value, Smoe.NulPaddedUtf8) else value
