// check_corpus.js: check a JavaScript softmax (alpha = 1) and sparsemax (alpha = 2) against
// entmax.jsonl of an entmax-ref corpus (format 2).  Node.js, no packages:
//
//     node check_corpus.js CORPUS_DIR
//
// Prints one line per case checked (PASS or FAIL with its tcId) and a summary; exits 1 when a
// case fails.  Numbers are read from the NAME_hex fields (C99 hex floats: exact), compared by
// the tolerance class of the field (the case's "tol"; the manifest's "tolerance_classes").
"use strict";
const fs = require("fs"), path = require("path");

// a C99 hex float ("-0x1.8p-1", "inf", "-inf", "nan") to the number it denotes, exactly
function hex(s) {
  if (s === "inf") return Infinity;
  if (s === "-inf") return -Infinity;
  if (s === "nan") return NaN;
  const m = /^(-?)0x([01])(?:\.([0-9a-f]*))?p([-+]\d+)$/.exec(s);
  if (!m) throw new Error(`not a hex float: ${s}`);
  const frac = m[3] || "", mant = parseInt(m[2] + frac, 16); // at most 53 bits: exact
  const e = Number(m[4]) - 4 * frac.length;
  const v = e < -1000 ? mant * 2 ** (e + 200) * 2 ** -200 : mant * 2 ** e; // one rounding at most
  return m[1] ? -v : v;
}

// the gap from |e| to the next larger value of dtype
function ulp(e, dtype) {
  const a = Math.abs(e);
  if (dtype === "float32") {
    const f = Math.fround(a), buf = new Float32Array([f]), bits = new Uint32Array(buf.buffer);
    bits[0] += 1;
    return buf[0] - f;
  }
  const buf = new Float64Array([a]), bits = new BigUint64Array(buf.buffer);
  bits[0] += 1n;
  return buf[0] - a;
}

// whether got matches entry i (value want) of output field name, by its tolerance class
function within(c, name, i, got, want) {
  if (Number.isNaN(want)) return Number.isNaN(got);
  if (!Number.isFinite(want)) return got === want;
  const cls = c.tol[name], arg = cls.slice(cls.indexOf(":") + 1);
  let bound;
  if (cls === "exact") bound = 0;
  else if (cls.startsWith("ulps:")) bound = Number(arg) * ulp(want, c.dtype);
  else if (cls.startsWith("abs:@")) {
    const t = c[`${arg.slice(1)}_hex`];
    bound = hex(Array.isArray(t) ? t[i] : t);
  } else if (cls.startsWith("abs:")) bound = arg.startsWith("0x") ? hex(arg) : Number(arg);
  else throw new Error(`${c.tcId}: unknown tolerance class ${cls}`);
  return Math.abs(got - want) <= bound;
}

// ------------------------------------------------------------------ the implementations under test
function softmax(x) {
  const m = Math.max(...x);
  if (m === -Infinity) return x.map(() => 0);
  const e = x.map((v) => Math.exp(v - m)), s = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / s);
}

function sparsemax(x) {
  const m = Math.max(...x);
  if (m === -Infinity) return x.map(() => 0);
  const z = x.map((v) => v - m).sort((a, b) => b - a);
  let cum = 0, tau = 0;
  z.forEach((v, k) => {  // the support: 1 + (k + 1) z_k > z_0 + ... + z_k
    cum += v;
    if (1 + (k + 1) * v > cum) tau = (cum - 1) / (k + 1);
  });
  return x.map((v) => Math.max(v - m - tau, 0));
}

// ------------------------------------------------------------------ the corpus loop
function main(dir) {
  const manifest = JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8"));
  if (manifest.format_major !== 2) throw new Error(`corpus format ${manifest.format_major}; this reader knows 2`);
  const impl = { "0x1p+0": softmax, "0x1p+1": sparsemax };
  let passed = 0, failed = 0;
  for (const line of fs.readFileSync(path.join(dir, "entmax.jsonl"), "utf8").split("\n")) {
    if (!line) continue;
    const c = JSON.parse(line), f = impl[c.alpha_hex];
    if (!f) continue;
    const x = c.x_hex.map(hex), want = c.p_hex.map(hex), p = f(x);
    const bad = want.findIndex((w, i) => !within(c, "p", i, p[i], w));
    if (bad < 0) {
      passed++;
      console.log(`PASS ${c.tcId} alpha=${c.alpha} ${c.dtype}`);
    } else {
      failed++;
      console.log(`FAIL ${c.tcId}: p[${bad}] = ${p[bad]}, expected ${want[bad]} (${c.why})`);
    }
  }
  console.log(`${passed} passed, ${failed} failed`);
  return failed || !passed ? 1 : 0;
}

if (process.argv.length !== 3) {
  console.error("usage: node check_corpus.js CORPUS_DIR");
  process.exit(2);
}
process.exit(main(process.argv[2]));
