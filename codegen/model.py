"""Read spec/smoe.ksy into a small model that the templates render.

The model holds what the hand-written templates need and the Kaitai compiler does
not give us: the packed C/numpy layout of each fixed-size struct, the format
constants (root value instances marked ``-smoe-const``), the enums and the docs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# ksy primitive -> (size, C type, numpy type, readable type)
_PRIMITIVES: dict[str, tuple[int, str, str, str]] = {
    "u1": (1, "uint8_t", "u1", "uint8"),
    "u2": (2, "uint16_t", "<u2", "uint16"),
    "u4": (4, "uint32_t", "<u4", "uint32"),
    "u8": (8, "uint64_t", "<u8", "uint64"),
    "f4": (4, "float", "<f4", "float32"),
}


@dataclass
class Field:
    """One member of a packed struct, named as in the reference C header (``-orig-id``)."""

    name: str
    offset: int
    size: int
    ctype: str
    carray: int | None
    nptype: str
    readable: str
    doc: str
    valid: str
    enum: str | None = None
    ksy_id: str = ""  # its id in the .ksy, the generated Kaitai parser's attribute name

    @property
    def c_decl(self) -> str:
        suffix = f"[{self.carray}]" if self.carray is not None else ""
        return f"{self.ctype} {self.name}{suffix};"


@dataclass
class Struct:
    """A fixed-size ksy type with a C++ mirror (``-smoe-struct``).

    ``ksy_id`` is the reference header's name for it (the type's ``-orig-id``, else its id),
    which keys the generated constants; ``type_id`` is its id in the .ksy.
    """

    ksy_id: str
    cpp_name: str
    doc: str
    doc_ref: str
    fields: list[Field]
    instances: list[dict[str, str]] = field(default_factory=list)
    type_id: str = ""

    @property
    def size(self) -> int:
        return sum(f.size for f in self.fields)

    @property
    def const_prefix(self) -> str:
        return self.ksy_id.upper()


@dataclass
class Constant:
    name: str
    ksy_id: str
    value: int | float
    doc: str

    @property
    def is_float(self) -> bool:
        return isinstance(self.value, float)


@dataclass
class EnumValue:
    name: str
    value: int
    doc: str


@dataclass
class Enum:
    ksy_id: str
    values: list[EnumValue]

    @property
    def class_name(self) -> str:
        return "".join(part.capitalize() for part in self.ksy_id.split("_"))


@dataclass
class Rule:
    """One entry of the rule registry (``-smoe-rules``)."""

    code: str
    severity: str
    load: bool
    deep: bool
    ksy: bool
    sidecar: bool
    rulings: tuple[str, ...]
    message: str

    @property
    def name(self) -> str:
        """The constant's name in Python and C++: ``table.order`` -> ``TABLE_ORDER``."""
        return self.code.replace(".", "_").upper()


@dataclass
class Flag:
    """One named bit of ``arch_block.flags``: the instance that reads it and its constant."""

    name: str
    constant: str


@dataclass
class Model:
    meta: dict[str, Any]
    doc: str
    doc_ref: list[str]
    structs: list[Struct]
    constants: list[Constant]
    enums: list[Enum]
    magics: dict[str, bytes]
    root_instances: list[dict[str, str]]
    supported_bits: tuple[int, ...]
    rulings: dict[str, list[str]]
    rules: list[Rule] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)

    def struct(self, ksy_id: str) -> Struct:
        return next(s for s in self.structs if s.ksy_id == ksy_id)

    def enum(self, ksy_id: str) -> Enum:
        return next(e for e in self.enums if e.ksy_id == ksy_id)

    def constant(self, name: str) -> Constant:
        return next(c for c in self.constants if c.name == name)


def _doc(node: dict[str, Any]) -> str:
    return str(node.get("doc", "")).strip()


def _orig_names(spec: dict[str, Any]) -> dict[str, str]:
    """.ksy id -> the reference header's name, for every attribute or instance with an
    ``-orig-id``."""
    names = {}
    for node in spec["types"].values():
        for attr in [*node.get("seq", []), *node.get("params", [])]:
            if "-orig-id" in attr:
                names[attr["id"]] = attr["-orig-id"]
        for name, inst in (node.get("instances") or {}).items():
            if "-orig-id" in inst:
                names[name] = inst["-orig-id"]
    return names


def _in_orig_names(text: str, names: dict[str, str]) -> str:
    """Docs for the C++ header and the numpy layout speak of fields by their names there:
    rename the .ksy ids inside `code spans`."""
    if not names:
        return text
    word = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return re.sub(r"`[^`]*`", lambda m: word.sub(lambda w: names[w.group(1)], m.group(0)), text)


def _doc_ref(node: dict[str, Any]) -> str:
    ref = node.get("doc-ref", "")
    return ", ".join(ref) if isinstance(ref, list) else str(ref)


def _valid_text(valid: Any) -> str:
    """A readable rendering of a ksy ``valid`` (or ``contents``) clause."""
    if valid is None:
        return ""
    if not isinstance(valid, dict):
        return f"== {valid}"
    parts = []
    if "eq" in valid:
        parts.append(f"== {valid['eq']}")
    if "min" in valid:
        parts.append(f">= {valid['min']}")
    if "max" in valid:
        parts.append(f"<= {valid['max']}")
    if "any-of" in valid:
        parts.append("one of " + ", ".join(str(v) for v in valid["any-of"]))
    if "expr" in valid:
        parts.append(" ".join(str(valid["expr"]).split()))
    return "; ".join(parts)


def _field(attr: dict[str, Any], offset: int, struct_id: str) -> Field:
    f = _c_field(attr, offset, struct_id)
    f.ksy_id = attr["id"]
    return f


def _c_field(attr: dict[str, Any], offset: int, struct_id: str) -> Field:
    name = attr.get("-orig-id", attr["id"])  # the reference header's name is frozen
    doc = _doc(attr)
    if "contents" in attr:
        contents = attr["contents"]
        raw = contents.encode("ascii") if isinstance(contents, str) else bytes(contents)
        shown = " ".join(f"{b:02X}" for b in raw)
        return Field(
            name,
            offset,
            len(raw),
            "uint8_t",
            len(raw),
            "u1",
            f"uint8[{len(raw)}]",
            doc,
            f"== {shown}",
        )
    typ = attr.get("type")
    if typ in _PRIMITIVES:
        size, ctype, nptype, readable = _PRIMITIVES[typ]
        enum = attr.get("enum")
        return Field(
            name,
            offset,
            size,
            ctype,
            None,
            nptype,
            readable if not enum else f"{readable} enum {enum}",
            doc,
            _valid_text(attr.get("valid")),
            enum,
        )
    if "size" in attr and isinstance(attr["size"], int):
        size = attr["size"]
        if typ == "strz" or "-smoe-text" in attr:  # a text field read as checked bytes
            encoding = attr.get("encoding", attr.get("-smoe-text", ""))
            return Field(
                name,
                offset,
                size,
                "char",
                size,
                f"S{size}",
                f"char[{size}]",
                doc,
                f"{encoding}, NUL-padded",
            )
        valid = "all zero" if typ == "zero_fill" else _valid_text(attr.get("valid"))
        return Field(name, offset, size, "uint8_t", size, "u1", f"uint8[{size}]", doc, valid)
    raise ValueError(f"{struct_id}.{name}: no fixed-size C mapping for {attr!r}")


def _instances(node: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    for name, inst in (node.get("instances") or {}).items():
        if "-smoe-const" in inst:
            continue
        if "value" in inst:
            kind, what = "computed", " ".join(str(inst["value"]).split())
        else:
            kind = "positioned"
            where = " ".join(str(inst.get("pos", "")).split())
            what = f"at {where}"
            if "size" in inst:
                what += f", {' '.join(str(inst['size']).split())} bytes"
            if "type" in inst:
                what += f", {inst['type']}"
            if "repeat-expr" in inst:
                what += f" x {inst['repeat-expr']}"
            if "if" in inst:
                what += f", if {inst['if']}"
        out.append({"name": name, "kind": kind, "what": what, "doc": _doc(inst)})
    return out


_ROOT_REF = re.compile(r"^_root\.([a-z0-9_]+)$")
_RULING = re.compile(r"\b[Rr]ulings? ((?:[DR]\d+)(?:(?:, | and )[DR]\d+)*)")


def _rulings(spec: dict[str, Any]) -> dict[str, list[str]]:
    """Ruling id -> the places of the spec whose doc or doc-ref states it."""
    found: dict[str, list[str]] = {}

    def visit(where: str, node: dict[str, Any]) -> None:
        text = f"{node.get('doc', '')} {node.get('doc-ref', '')}"
        refs = set()
        for m in _RULING.finditer(text):
            refs.update(re.findall(r"[DR]\d+", m.group(1)))
        for m in re.finditer(r"FORMAT\.md ((?:D\d+)(?:, D\d+)*)", text):
            refs.update(re.findall(r"D\d+", m.group(1)))
        for r in refs:
            found.setdefault(r, []).append(where)

    visit("overview", spec)
    for name, inst in (spec.get("instances") or {}).items():
        visit(name, inst)
    for type_id, node in spec["types"].items():
        visit(type_id, node)
        for attr in node.get("seq", []):
            visit(f"{type_id}.{attr['id']}", attr)
        for name, inst in (node.get("instances") or {}).items():
            visit(f"{type_id}.{name}", inst)
    return dict(sorted(found.items(), key=lambda kv: (kv[0][0], int(kv[0][1:]))))


_RULE_KEYS = {"code", "severity", "load", "deep", "ksy", "sidecar", "ruling", "message"}
_RULE_CODE = re.compile(r"^[a-z]+\.[a-z0-9_]+$")
_SEVERITIES = ("error", "warning", "info")


def _rules(spec: dict[str, Any]) -> list[Rule]:
    """The rule registry at the end of the .ksy, checked for shape and uniqueness."""
    out: list[Rule] = []
    for i, node in enumerate(spec.get("-smoe-rules") or []):
        where = f"-smoe-rules[{i}]"
        if not isinstance(node, dict) or not {"code", "severity", "load", "ksy", "message"} <= set(
            node
        ):
            raise ValueError(f"{where}: needs code, severity, load, ksy and message")
        if set(node) - _RULE_KEYS:
            raise ValueError(f"{where}: unknown keys {sorted(set(node) - _RULE_KEYS)}")
        code = str(node["code"])
        if not _RULE_CODE.match(code):
            raise ValueError(f"{where}: code {code!r} is not <scope>.<name>")
        if node["severity"] not in _SEVERITIES:
            raise ValueError(f"{where} {code}: severity must be one of {_SEVERITIES}")
        flags = {k: node.get(k, False) for k in ("load", "deep", "ksy", "sidecar")}
        if not all(isinstance(v, bool) for v in flags.values()):
            raise ValueError(f"{where} {code}: load, deep, ksy and sidecar are booleans")
        if flags["load"] and (node["severity"] != "error" or flags["deep"]):
            raise ValueError(f"{where} {code}: a load rule is an error seen without a deep check")
        if not str(node["message"]).isascii():
            raise ValueError(f"{where} {code}: the message must be ASCII (it is a C string too)")
        rulings = tuple(str(r) for r in node.get("ruling") or ())
        if not all(re.fullmatch(r"[DR]\d+", r) for r in rulings):
            raise ValueError(f"{where} {code}: rulings are D<n> or R<n>")
        out.append(
            Rule(
                code,
                node["severity"],
                flags["load"],
                flags["deep"],
                flags["ksy"],
                flags["sidecar"],
                rulings,
                " ".join(str(node["message"]).split()),
            )
        )
    for attr in ("code", "name"):
        seen = [getattr(r, attr) for r in out]
        dup = sorted({x for x in seen if seen.count(x) > 1})
        if dup:
            raise ValueError(f"-smoe-rules: {attr} given twice: {dup}")
    return out


_FLAG_VALUE = re.compile(r"^\(flags & _root\.([a-z0-9_]+)(?:\.as<u4>)?\) != 0$")


def _flags(spec: dict[str, Any], by_ksy: dict[str, Constant]) -> list[Flag]:
    """The arch block's boolean instances ``(flags & _root.<constant>) != 0``, in bit order."""
    bits = []
    for name, inst in (spec["types"]["arch_block"].get("instances") or {}).items():
        m = _FLAG_VALUE.match(" ".join(str(inst.get("value", "")).split()))
        if m:
            bits.append((by_ksy[m.group(1)].value, Flag(name, by_ksy[m.group(1)].name)))
    return [f for _, f in sorted(bits, key=lambda b: b[0])]


def load(path: Path) -> Model:
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    root_instances = spec.get("instances") or {}

    constants = [
        Constant(inst["-smoe-const"], name, inst["value"], _doc(inst))
        for name, inst in root_instances.items()
        if "-smoe-const" in inst
    ]
    by_ksy = {c.ksy_id: c for c in constants}

    structs = []
    magics: dict[str, bytes] = {}
    sizes: dict[str, int] = {}
    for type_id, node in spec["types"].items():
        if "-smoe-struct" not in node:
            continue
        struct_id = node.get("-orig-id", type_id)
        offset = 0
        fields = []
        for attr in node["seq"]:
            f = _field(attr, offset, type_id)
            fields.append(f)
            offset += f.size
            if attr["id"] == "magic":
                c = attr["contents"]
                magics[struct_id] = c.encode("ascii") if isinstance(c, str) else bytes(c)
        structs.append(
            Struct(
                struct_id,
                node["-smoe-struct"],
                _doc(node),
                _doc_ref(node),
                fields,
                _instances(node),
                type_id,
            )
        )
        sizes[type_id] = offset

    def resolve(text: str) -> str:
        """Spell constants and struct sizes out, for readers of the rendered spec; drop the
        `.as<u8>`-style casts, which only keep typed targets exact (docs/KAITAI_TARGETS.md)."""
        text = re.sub(r"\.as<[us][1248]>", "", text)
        text = re.sub(
            r"_root\.([a-z0-9_]+)",
            lambda m: str(by_ksy[m.group(1)].value) if m.group(1) in by_ksy else m.group(0),
            text,
        )
        return re.sub(r"sizeof<([a-z_]+)>", lambda m: str(sizes.get(m.group(1), m.group(0))), text)

    orig = _orig_names(spec)
    for st in structs:
        st.doc = _in_orig_names(st.doc, orig)
        for f in st.fields:
            f.valid = resolve(f.valid)
            f.doc = _in_orig_names(f.doc, orig)
        for inst in st.instances:
            inst["what"] = resolve(inst["what"])
    for c in constants:
        c.doc = _in_orig_names(c.doc, orig)

    enums = [
        Enum(
            enum_id,
            [
                EnumValue(
                    v["id"] if isinstance(v, dict) else v, k, _doc(v) if isinstance(v, dict) else ""
                )
                for k, v in values.items()
            ],
        )
        for enum_id, values in spec.get("enums", {}).items()
    ]

    header_type = next(
        t for t, node in spec["types"].items() if node.get("-orig-id", t) == "header"
    )
    bits_attr = next(a for a in spec["types"][header_type]["seq"] if a["id"] == "bits")
    supported = []
    for ref in bits_attr["valid"]["any-of"]:
        m = _ROOT_REF.match(str(ref))
        supported.append(int(by_ksy[m.group(1)].value) if m else int(ref))

    doc_ref = spec.get("doc-ref", [])
    return Model(
        meta=spec["meta"],
        doc=_doc(spec),
        doc_ref=doc_ref if isinstance(doc_ref, list) else [doc_ref],
        structs=structs,
        constants=constants,
        enums=enums,
        magics=magics,
        root_instances=[{**i, "what": resolve(i["what"])} for i in _instances(spec)],
        supported_bits=tuple(supported),
        rulings=_rulings(spec),
        rules=_rules(spec),
        flags=_flags(spec, by_ksy),
    )
