#!/usr/bin/env node
// Parse a vault with the JavaScript parser that kaitai-struct-compiler generates from
// spec/smoe.ksy, touching every instance that carries a check, and print every field as JSON.
//
// usage: node parse.js PARSER.js SPEC.ksy VAULT [BLOBS]
//   PARSER.js  the compiled parser (Smoe.js); `kaitai-struct` (the npm runtime) and `js-yaml`
//              must resolve from it, e.g. through NODE_PATH=codegen/node_modules
//   BLOBS      "all" (default): read every expert's packed codes, scales and padding;
//              "none", or a comma-separated list of table indices whose blobs are read
// stdout: {"header": {...}, "arch": {...} | null, "experts": [{..., "tensors": [{...,
//          "packed": hex, "scales": hex}], "padding": n}]}, keyed by the .ksy's ids, or
//          {"error": class name, "path": .ksy path} when the parser rejects the vault.
// Values: integers as numbers, f4 as the integer of its IEEE-754 bits, enums as integers,
// byte strings as hex, zero_fill runs as their length, NUL-padded names as text.
"use strict";
const fs = require("fs");
const path = require("path");
const yaml = require("js-yaml");
const KaitaiStream = require("kaitai-struct/KaitaiStream");

// The npm runtime 0.11 drops the .ksy path that generated code passes to its validation
// errors (their constructors take only the values): keep it, as the other runtimes do.
for (const name of Object.keys(KaitaiStream)) {
  const Base = KaitaiStream[name];
  if (!/^Validation\w+Error$/.test(name) || typeof Base !== "function") continue;
  KaitaiStream[name] = class extends Base {
    constructor(...args) {
      super(...args);
      Object.setPrototypeOf(this, new.target.prototype);
      this.name = name;
      this.srcPath = args[args.length - 1];
    }
  };
}

const camel = (id) => id.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
const hex = (bytes) => Buffer.from(bytes).toString("hex");
const f32bits = (x) => {
  const v = new DataView(new ArrayBuffer(4));
  v.setFloat32(0, x, true);
  return v.getUint32(0, true);
};
const COMPARISON = /==|!=|>=|<=|<|>|\bnot\b/;

/** [id, kind] of a type's seq fields and value instances, in .ksy order. */
function fieldsOf(spec, typeId) {
  const type = spec.types[typeId];
  const out = [];
  for (const a of type.seq) {
    let kind;
    if ("contents" in a) kind = "bytes";
    else if (a.type === "zero_fill") kind = "zerofill";
    else if (a.type === "nul_padded_utf8") kind = "text";
    else if ("enum" in a) kind = "enum";
    else if (a.type === "f4") kind = "float";
    else if (/^u[1248]$/.test(a.type)) kind = "int";
    else throw new Error(`parse.js: no JSON mapping for ${typeId}.${a.id}`);
    out.push([a.id, kind]);
  }
  for (const [id, inst] of Object.entries(type.instances || {})) {
    if (!("value" in inst)) continue;
    const expr = String(inst.value).replace(/(\.as|sizeof)<\w+>/g, "");
    out.push([id, COMPARISON.test(expr) ? "bool" : "int"]);
  }
  return out;
}

function plain(obj, fields) {
  const out = {};
  for (const [id, kind] of fields) {
    const v = obj[camel(id)];
    if (kind === "bytes") out[id] = hex(v);
    else if (kind === "zerofill") out[id] = v.bytes.length;
    else if (kind === "text") out[id] = v.text;
    else if (kind === "float") out[id] = f32bits(v);
    else out[id] = v;
  }
  return out;
}

function dump(Smoe, spec, data, blobs) {
  const pick = new Set(blobs === "all" || blobs === "none" ? [] : blobs.split(",").map(Number));
  const s = new Smoe(new KaitaiStream(data));
  const f = (t) => fieldsOf(spec, t);
  const header = plain(s.header, f("file_header"));
  const arch = s.arch === undefined || s.arch === null ? null : plain(s.arch, f("arch_block"));
  const experts = s.experts.map((e, i) => {
    const touch = blobs === "all" || pick.has(i);
    const row = plain(e, f("expert_entry"));
    row.tensors = e.tensors.map((d) => {
      const t = plain(d, f("tensor_descriptor"));
      if (touch) Object.assign(t, { packed: hex(d.packed), scales: hex(d.scales) });
      return t;
    });
    if (touch) row.padding = e.padding.bytes.length;
    return row;
  });
  return { header, arch, experts };
}

/** The file in one ArrayBuffer (the JS runtime parses memory), read in chunks: no 2 GiB cap. */
function readWhole(file) {
  const fd = fs.openSync(file, "r");
  try {
    const size = fs.fstatSync(fd).size;
    const data = new ArrayBuffer(size);
    const CHUNK = 1 << 30;
    for (let at = 0; at < size;) {
      const n = fs.readSync(fd, new Uint8Array(data, at, Math.min(CHUNK, size - at)), 0,
        Math.min(CHUNK, size - at), at);
      if (n === 0) throw new Error(`${file}: file shrank while reading at offset ${at}`);
      at += n;
    }
    return data;
  } finally {
    fs.closeSync(fd);
  }
}

function main() {
  const [parserPath, ksyPath, vaultPath, blobs = "all"] = process.argv.slice(2);
  if (!vaultPath) {
    process.stderr.write("usage: node parse.js PARSER.js SPEC.ksy VAULT [BLOBS]\n");
    process.exit(2);
  }
  const mod = require(path.resolve(parserPath));
  const Smoe = mod.Smoe || mod;
  const spec = yaml.load(fs.readFileSync(ksyPath, "utf8"));
  const data = readWhole(vaultPath);
  let out;
  try {
    out = dump(Smoe, spec, data, blobs);
  } catch (e) {
    if (!(e instanceof Error) || !/Error$/.test(e.name || "")) throw e;
    out = { error: e.name, path: e.srcPath === undefined ? null : e.srcPath };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main();
