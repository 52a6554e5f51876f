#!/usr/bin/env node
// Run the pinned Kaitai Struct compiler on one .ksy and report every problem.
//
// The compiler's JS API (`compile()`) throws on the first error and drops all
// warnings.  We load the very same bundle, but install a hook on its internal
// precompile step so that every problem (errors and warnings) is collected.
//
// usage: node ksc.js SPEC.ksy LANG [LANG ...]
//        node ksc.js --all [--out DIR] SPEC.ksy
// stdout: JSON {"version", "files": {lang: {name: text}}, "problems": [{severity, text}]}
//   (with --all only a one-line summary per target, on stderr; --out DIR writes the files)
// --all compiles for every target the compiler supports. A target in UNSUPPORTED is still
// tried; failing there the known way is reported as "unsupported", not as an error.
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

// Targets whose translator cannot express what the spec needs (docs/KAITAI_TARGETS.md has
// the minimal reproduction): the text its failure carries, and why.
const UNSUPPORTED = {
  nim: {
    signature: "NimTranslator.doInternalName",
    why: "the Nim translator does not implement `valid: expr` (scala.NotImplementedError)",
  },
};

/** The message of a compiler exception, with the chain of causes Scala.js boxes it in. */
function describe(e) {
  const parts = [];
  for (let x = e, depth = 0; x && depth < 8; depth++) {
    const msg = typeof x.getMessage === "function" ? x.getMessage()
      : (x.jl_Throwable__f_s !== undefined ? x.jl_Throwable__f_s : String(x));
    const cls = x.$classData ? x.$classData.name : (x.constructor && x.constructor.name) || "";
    parts.push(cls && !String(msg).startsWith(cls) ? `${cls}: ${msg}` : String(msg));
    // The innermost compiler frame names the translator method that gave up.
    const stack = x.jl_Throwable__f_jsErrorForStackTrace && x.jl_Throwable__f_jsErrorForStackTrace.stack;
    const frame = stack && /\$c_Lio_kaitai_struct_(?:[a-z]+_)*([A-Z]\w*)\.(\w+?)__/.exec(stack);
    if (frame) parts.push(`at ${frame[1]}.${frame[2]}`);
    x = x.jl_Throwable__f_e;
  }
  return parts.join(" <- ");
}

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

function parseArgs(argv) {
  const args = { all: false, out: null, ksy: null, langs: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--all") args.all = true;
    else if (argv[i] === "--out") args.out = argv[++i];
    else if (args.ksy === null) args.ksy = argv[i];
    else args.langs.push(argv[i]);
  }
  return args;
}

function writeFiles(dir, files) {
  for (const [lang, byName] of Object.entries(files)) {
    for (const [name, text] of Object.entries(byName)) {
      // Java and Go file names come with a leading "/" (no package configured).
      const file = path.join(dir, lang, name.replace(/^\/+/, ""));
      fs.mkdirSync(path.dirname(file), { recursive: true });
      fs.writeFileSync(file, text);
    }
  }
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (!args.ksy || (args.all === (args.langs.length > 0)) || (args.out === undefined)) {
    process.stderr.write("usage: node ksc.js SPEC.ksy LANG [LANG ...]\n"
      + "       node ksc.js --all [--out DIR] SPEC.ksy\n");
    process.exit(2);
  }
  const ksyPath = args.ksy;
  globalThis.__kscProblems = [];
  const compiler = loadCompiler();
  const langs = args.all ? compiler.languages.slice() : args.langs;
  const spec = yaml.load(fs.readFileSync(ksyPath, "utf8"));
  const out = { version: compiler.version, files: {}, problems: globalThis.__kscProblems };
  let failed = false;
  for (const lang of langs) {
    try {
      out.files[lang] = await compiler.compile(lang, spec, null, false);
    } catch (e) {
      const text = describe(e);
      const known = UNSUPPORTED[lang];
      if (known && text.includes(known.signature)) {
        out.problems.push({ severity: "unsupported", text: `${lang}: ${known.why} (${text})` });
        continue;
      }
      failed = true;
      const reported = out.problems.some((p) => text.includes(p.text));
      if (!reported) out.problems.push({ severity: "error", text: `${path.basename(ksyPath)} (${lang}): ${text}` });
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
  if (args.out) writeFiles(args.out, out.files);
  if (!args.all) {
    process.stdout.write(JSON.stringify(out));
    return;
  }
  for (const p of out.problems) process.stderr.write(`ksc ${out.version} ${p.severity}: ${p.text}\n`);
  const built = Object.keys(out.files);
  process.stderr.write(`ksc ${out.version}: ${path.basename(ksyPath)} compiles for ${built.length} `
    + `of ${langs.length} targets (${built.join(", ")})${failed ? "; FAILED" : ""}\n`);
}

main().catch((e) => {
  process.stderr.write(`ksc.js: ${e && e.stack ? e.stack : e}\n`);
  process.exit(2);
});
