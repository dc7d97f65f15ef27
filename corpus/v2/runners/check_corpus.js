// check_corpus.js: check a JavaScript alpha-entmax and its gradient against entmax.jsonl and
// entmax_vjp.jsonl of an entmax-ref corpus (format 2).  Node.js, no packages:
//
//     node check_corpus.js CORPUS_DIR
//
// Every field a file's tolerance classes name is checked: p, tau and support of entmax.jsonl, dx
// of entmax_vjp.jsonl.  Prints one line per failing case (its tcId, the field and index, the
// value got and expected in hex, the bound and its class), then counts per file, field and class,
// and a total; exits 1 when a case fails.  Numbers are read from the NAME_hex fields (C99 hex
// floats: exact).  Replace entmax() and entmaxVjp() by your own.
"use strict";
const fs = require("fs"), path = require("path");

// true when the implementation below returns correctly rounded float64 values (the float64 cases
// whose class is "exact" are then compared); this one is not, so it skips those fields
const EXACT_FLOAT64 = false;

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

// a number as printf's %a writes it (the corpus's hex form)
function toHex(v) {
  if (Number.isNaN(v)) return "nan";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  const bits = new BigUint64Array(new Float64Array([v]).buffer)[0];
  const sign = bits >> 63n ? "-" : "", exp = Number((bits >> 52n) & 0x7ffn);
  let mant = (bits & 0xfffffffffffffn).toString(16).padStart(13, "0").replace(/0+$/, "");
  mant = mant ? "." + mant : "";
  if (exp === 0) return v === 0 ? `${sign}0x0p+0` : `${sign}0x0${mant}p-1022`;
  const e = exp - 1023;
  return `${sign}0x1${mant}p${e < 0 ? "-" : "+"}${Math.abs(e)}`;
}

// the numbers of field name: name_hex, or name itself for an integer field (support, tol_support)
function field(c, name) {
  const h = c[`${name}_hex`];
  if (h === undefined) return [].concat(c[name]).flat(Infinity);
  return [].concat(h).flat(Infinity).map(hex);
}

// the bound on |got - expected| of entry i (of n) of output field name, by its tolerance class
function bound(c, name, i, n) {
  const cls = c.tol[name];
  if (cls === "exact") return 0;
  if (cls.startsWith("abs:@")) {
    const t = field(c, cls.slice(5));
    return t[t.length === n ? i : Math.floor((i * t.length) / n)]; // fewer bounds broadcast (per row)
  }
  throw new Error(`${c.tcId}: unknown tolerance class ${cls}`);
}

function within(c, name, i, n, got, want) {
  if (Number.isNaN(want)) return Number.isNaN(got);
  if (!Number.isFinite(want)) return got === want;
  return Math.abs(got - want) <= bound(c, name, i, n);
}

// ------------------------------------------------------------------ the implementation under test
// alpha-entmax of x: {p, tau, support} (tau in p_i = [(alpha-1) x_i - tau]_+^(1/(alpha-1)),
// logsumexp(x) at alpha 1); softmax at alpha 1, sparsemax by sorting at 2, bisection on the
// threshold otherwise; null outside its domain (1 < alpha < 1.01, alpha > 2); throws on NaN or +inf.
function entmax(x, alpha) {
  if (x.some((v) => Number.isNaN(v) || v === Infinity)) throw new Error("NaN or +inf score");
  const a1 = alpha - 1, n = x.length;
  if ((alpha !== 1 && a1 < 0.01) || alpha > 2) return null;
  const m = Math.max(...x);
  if (m === -Infinity) return { p: x.map(() => 0), tau: -Infinity, support: 0 };
  const z = x.map((v) => v - m);
  let p, t = 0;
  if (alpha === 1) {
    p = z.map(Math.exp);
    t = Math.log(p.reduce((a, b) => a + b, 0));
  } else if (alpha === 2) {
    let cum = 0;
    [...z].sort((a, b) => b - a).forEach((v, k) => { // the support: 1 + (k + 1) z_k > z_0 + ... + z_k
      cum += v;
      if (1 + (k + 1) * v > cum) t = (cum - 1) / (k + 1);
    });
    p = z.map((v) => Math.max(v - t, 0));
  } else {
    let lo = -1, hi = -((1 / n) ** a1);
    const mass = (s) => z.reduce((acc, v) => acc + (a1 * v > s ? (a1 * v - s) ** (1 / a1) : 0), 0);
    for (let it = 0; it < 2000; it++) {
      const mid = 0.5 * (lo + hi);
      if (mid <= lo || mid >= hi) break;
      if (mass(mid) >= 1) lo = mid; else hi = mid;
    }
    t = lo;
    p = z.map((v) => (a1 * v > t ? (a1 * v - t) ** (1 / a1) : 0));
  }
  const sum = p.reduce((a, b) => a + b, 0);
  p = p.map((v) => v / sum);
  const tau = alpha === 1 ? m + t : a1 * m + t; // back from x - max x to x
  return { p, tau, support: p.filter((v) => v > 0).length };
}

// dx = J^T g at p: u = p^(2 - alpha) on the support, dx = u (g - <u, g> / sum u)
function entmaxVjp(p, g, alpha) {
  const u = p.map((v) => (v > 0 ? v ** (2 - alpha) : 0));
  const su = u.reduce((a, b) => a + b, 0), sug = u.reduce((a, v, i) => a + v * g[i], 0);
  return u.map((v, i) => (su > 0 ? v * (g[i] - sug / su) : 0));
}

// ------------------------------------------------------------------ the corpus loop
const tallies = new Map();
function tally(file, name, cls) {
  const key = `${file} ${name} ${cls}`;
  if (!tallies.has(key)) tallies.set(key, { passed: 0, failed: 0, skipped: 0 });
  return tallies.get(key);
}

// compare field name: true passed, false failed (a line printed unless quiet), null not compared
function checkField(file, c, name, got, quiet) {
  const cls = c.tol[name], t = tally(file, name, cls);
  if (!EXACT_FLOAT64 && c.dtype === "float64" && cls === "exact") {
    t.skipped++;
    return null;
  }
  const want = field(c, name);
  const bad = want.length !== got.length ? 0 : want.findIndex((w, i) => !within(c, name, i, want.length, got[i], w));
  if (bad >= 0 && !quiet) {
    const what = c.verdict === "acceptable" ? "ACCEPTABLE" : "FAIL";
    console.log(`${what} ${c.tcId} ${name}[${bad}]: got ${toHex(got[bad])}, expected ${toHex(want[bad])}, ` +
                `bound ${toHex(bound(c, name, bad, want.length))} (${cls})`);
  }
  if (bad < 0) t.passed++; else t.failed++;
  return bad < 0;
}

// one case: "passed", "failed", "skipped" or "acceptable" (an acceptable case that differs)
function checkCase(file, c) {
  const alpha = hex(c.alpha_hex), x = field(c, "x");
  let results;
  if (file === "entmax_vjp.jsonl") {
    results = [checkField(file, c, "dx", entmaxVjp(field(c, "p"), field(c, "grad"), alpha), false)];
  } else {
    let r;
    try {
      r = entmax(x, alpha);
    } catch (e) {
      if (c.error) {
        tally(file, "error", c.error).passed++;
        return "passed"; // an error was expected, and reported
      }
      console.log(`FAIL ${c.tcId} error: ${e.message} for scores the corpus solves`);
      tally(file, "error", "none").failed++;
      return "failed";
    }
    if (r === null) {
      tally(file, "p", c.tol.p).skipped++;
      return "skipped";
    }
    const p = checkField(file, c, "p", r.p, false);
    const tau = checkField(file, c, "tau", [r.tau], p === false);
    results = [p, tau, checkField(file, c, "support", [r.support], p === false || tau === false)];
  }
  if (results.every((v) => v === null)) return "skipped";
  if (!results.includes(false)) return "passed";
  return c.verdict === "acceptable" ? "acceptable" : "failed";
}

function main(dir) {
  const manifest = JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8"));
  if (manifest.format_major !== 2) throw new Error(`corpus format ${manifest.format_major}; this reader knows 2`);
  const total = { passed: 0, failed: 0, skipped: 0, acceptable: 0 };
  for (const file of ["entmax.jsonl", "entmax_vjp.jsonl"]) {
    for (const line of fs.readFileSync(path.join(dir, file), "utf8").split("\n")) {
      if (line) total[checkCase(file, JSON.parse(line))]++;
    }
  }
  for (const [key, t] of tallies) console.log(`${key}: ${t.passed} passed, ${t.failed} failed, ${t.skipped} skipped`);
  const extra = total.acceptable ? `, ${total.acceptable} acceptable differences` : "";
  console.log(`${total.passed} passed, ${total.failed} failed, ${total.skipped} skipped${extra}`);
  return total.failed || !total.passed ? 1 : 0;
}

if (process.argv.length !== 3) {
  console.error("usage: node check_corpus.js CORPUS_DIR");
  process.exit(2);
}
process.exit(main(process.argv[2]));
