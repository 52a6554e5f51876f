#!/usr/bin/env node
// Run the pinned Kaitai Struct compiler on one .ksy and report every problem.
//
// The compiler's JS API (`compile()`) throws on the first error and drops all
// warnings.  We load the very same bundle, but install a hook on its internal
// precompile step so that every problem (errors and warnings) is collected.
//
// usage: node ksc.js SPEC.ksy LANG [LANG ...]
// stdout: JSON {"version", "files": {lang: {name: text}}, "problems": [{severity, text}]}
// exit: 0 ok (warnings possible), 1 compile errors, 2 usage / setup failure.
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");
const yaml = require("js-yaml");

const ANCHOR = "MainJs = $m_Lio_kaitai_struct_MainJs$();";
const HOOK = `
(function () {
  const proto = $c_Lio_kaitai_struct_Main$.prototype;
  const name = "precompile__Lio_kaitai_struct_format_ClassSpecs__Lio_kaitai_struct_RuntimeConfig__sc_Iterable";
  const orig = proto[name];
  if (typeof orig !== "function") throw new Error("ksc.js: precompile hook target not found");
  proto[name] = function (specs, conf) {
    const problems = orig.call(this, specs, conf);
    const it = problems.iterator__sc_Iterator();
    while (it.hasNext__Z()) {
      const p = it.next__O();
      globalThis.__kscProblems.push({
        severity: p.severity__Lio_kaitai_struct_problems_ProblemSeverity().message__T(),
        text: p.message__T().trim(),
      });
    }
    return problems;
  };
})();
`;

function loadCompiler() {
  const file = require.resolve("kaitai-struct-compiler");
  const src = fs.readFileSync(file, "utf8");
  if (src.split(ANCHOR).length !== 2) {
    throw new Error(`ksc.js: anchor not found exactly once in ${file}; compiler version changed?`);
  }
  const patched = src.replace(ANCHOR, HOOK + ANCHOR);
  const mod = { exports: {} };
  const fn = vm.runInThisContext(`(function (module, exports) {${patched}\n})`, { filename: file });
  fn(mod, mod.exports);
  return mod.exports;
}

async function main() {
  const [ksyPath, ...langs] = process.argv.slice(2);
  if (!ksyPath || langs.length === 0) {
    process.stderr.write("usage: node ksc.js SPEC.ksy LANG [LANG ...]\n");
    process.exit(2);
  }
  globalThis.__kscProblems = [];
  const compiler = loadCompiler();
  const spec = yaml.load(fs.readFileSync(ksyPath, "utf8"));
  const out = { version: compiler.version, files: {}, problems: globalThis.__kscProblems };
  let failed = false;
  for (const lang of langs) {
    try {
      out.files[lang] = await compiler.compile(lang, spec, null, false);
    } catch (e) {
      failed = true;
      const text = (e && typeof e.getMessage === "function") ? e.getMessage() : String(e);
      const known = out.problems.some((p) => text.includes(p.text));
      if (!known) out.problems.push({ severity: "error", text: `${path.basename(ksyPath)} (${lang}): ${text}` });
    }
  }
  // The same precompile problems are reported once per language: keep one copy.
  const seen = new Set();
  out.problems = out.problems.filter((p) => {
    const key = p.severity + "\u0000" + p.text;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
  if (out.problems.some((p) => p.severity === "error")) failed = true;
  // Set the exit code and let node drain stdout: process.exit() would cut a piped write.
  process.exitCode = failed ? 1 : 0;
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  process.stderr.write(`ksc.js: ${e && e.stack ? e.stack : e}\n`);
  process.exit(2);
});
