//! Check a short Rust alpha-entmax and its gradient against entmax.jsonl and entmax_vjp.jsonl of an
//! entmax-ref corpus (format 2):
//!
//!     cargo run --release --example check_entmax -- CORPUS_DIR
//!
//! Every field a file's tolerance classes name is checked: p, tau and support of entmax.jsonl, dx
//! of entmax_vjp.jsonl.  Prints one line per failing case (its tcId, the field and index, the value
//! got and expected in hex, the bound and its class), then counts per file, field and class, and a
//! total; exits 1 when a case fails, 2 when the corpus cannot be read.  Replace `entmax` and
//! `entmax_vjp` by your own.

use entmax_corpus::{f64_to_hex, read_cases, Case, Tallies};
use std::process::exit;

/// true when the implementation below returns correctly rounded float64 values (the float64 cases
/// whose class is "exact" are then compared); this one is not, so it skips those fields.
const EXACT_FLOAT64: bool = false;

// ---------------------------------------------------------------- the implementation under test

/// What the implementation returns: the result, a case outside its domain, or an error.
enum Outcome {
    Solved { p: Vec<f64>, tau: f64, support: usize },
    Unsupported,
    Invalid,
}

/// alpha-entmax of x, its threshold tau (p_i = [(alpha-1) x_i - tau]_+^(1/(alpha-1)), tau =
/// logsumexp(x) at alpha = 1) and its support size: softmax at alpha = 1, sparsemax by sorting at
/// alpha = 2, else bisection on the threshold t of x - max x.  Unsupported for 1 < alpha < 1.01
/// (the power loses precision) and alpha > 2 (a plain bisection loses the support's edge);
/// Invalid for NaN or +inf scores.
fn entmax(x: &[f64], alpha: f64) -> Outcome {
    if x.iter().any(|v| v.is_nan() || *v == f64::INFINITY) {
        return Outcome::Invalid;
    }
    let a1 = alpha - 1.0;
    if (alpha != 1.0 && a1 < 0.01) || alpha > 2.0 {
        return Outcome::Unsupported;
    }
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return Outcome::Solved { p: vec![0.0; x.len()], tau: f64::NEG_INFINITY, support: 0 }; // all masked
    }
    let z: Vec<f64> = x.iter().map(|v| v - m).collect();
    let (mut p, t): (Vec<f64>, f64) = if alpha == 1.0 {
        let p: Vec<f64> = z.iter().map(|v| v.exp()).collect();
        let sum: f64 = p.iter().sum();
        (p, sum.ln())
    } else if alpha == 2.0 {
        let mut sorted = z.clone();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let (mut cum, mut t) = (0.0, 0.0);
        for (k, v) in sorted.iter().enumerate() {
            // the support: 1 + (k + 1) z_k > z_0 + ... + z_k
            cum += v;
            if 1.0 + (k + 1) as f64 * v > cum {
                t = (cum - 1.0) / (k + 1) as f64;
            }
        }
        (z.iter().map(|v| if *v > t { v - t } else { 0.0 }).collect(), t)
    } else {
        let mass = |s: f64| -> f64 { z.iter().map(|v| if a1 * v > s { (a1 * v - s).powf(1.0 / a1) } else { 0.0 }).sum() };
        let (mut lo, mut hi) = (-1.0, -(1.0 / z.len() as f64).powf(a1));
        for _ in 0..2000 {
            let mid = 0.5 * (lo + hi);
            if mid <= lo || mid >= hi {
                break;
            }
            if mass(mid) >= 1.0 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (z.iter().map(|v| if a1 * v > lo { (a1 * v - lo).powf(1.0 / a1) } else { 0.0 }).collect(), lo)
    };
    let sum: f64 = p.iter().sum();
    p.iter_mut().for_each(|v| *v /= sum);
    let tau = if alpha == 1.0 { m + t } else { a1 * m + t }; // back from x - max x to x
    let support = p.iter().filter(|v| **v > 0.0).count();
    Outcome::Solved { p, tau, support }
}

/// dx = J^T g at p: u = p^(2 - alpha) on the support, dx = u (g - <u, g> / sum u).
fn entmax_vjp(p: &[f64], g: &[f64], alpha: f64) -> Vec<f64> {
    let u: Vec<f64> = p.iter().map(|v| if *v > 0.0 { v.powf(2.0 - alpha) } else { 0.0 }).collect();
    let su: f64 = u.iter().sum();
    let sug: f64 = u.iter().zip(g).map(|(a, b)| a * b).sum();
    u.iter().zip(g).map(|(v, gi)| if su > 0.0 { v * (gi - sug / su) } else { 0.0 }).collect()
}

// ---------------------------------------------------------------- the corpus loop

/// Compare field `name`: Some(true) passed, Some(false) failed (a line printed unless quiet),
/// None not compared (an exact float64 field this implementation cannot meet).
fn check_field(t: &mut Tallies, file: &str, c: &Case, name: &str, got: &[f64], quiet: bool) -> Option<bool> {
    let class = c.class(name).to_string();
    if !EXACT_FLOAT64 && c.str("dtype") == "float64" && class == "exact" {
        t.count(file, name, &class, 2);
        return None;
    }
    let want = c.numbers(name);
    let n = want.len();
    let bad = if got.len() != n { Some(0) } else { (0..n).find(|&i| !c.within(name, i, n, got[i], want[i])) };
    if let (Some(i), false) = (bad, quiet) {
        let what = if c.str("verdict") == "acceptable" { "ACCEPTABLE" } else { "FAIL" };
        let (g, w) = (got.get(i).cloned().unwrap_or(f64::NAN), want.get(i).cloned().unwrap_or(f64::NAN));
        let b = c.bound(name, i, n).unwrap_or(f64::NAN);
        println!("{} {} {}[{}]: got {}, expected {}, bound {} ({})", what, c.str("tcId"), name, i, f64_to_hex(g),
                 f64_to_hex(w), f64_to_hex(b), class);
    }
    t.count(file, name, &class, if bad.is_none() { 0 } else { 1 });
    Some(bad.is_none())
}

/// One case: Some(true) passed, Some(false) failed, None skipped.
fn check_case(t: &mut Tallies, file: &str, c: &Case) -> Option<bool> {
    let alpha = c.numbers("alpha")[0];
    let results = if file == "entmax_vjp.jsonl" {
        vec![check_field(t, file, c, "dx", &entmax_vjp(&c.numbers("p"), &c.numbers("grad"), alpha), false)]
    } else {
        match entmax(&c.numbers("x"), alpha) {
            Outcome::Unsupported => {
                t.count(file, "p", c.class("p"), 2);
                return None;
            }
            Outcome::Invalid if !c.str("error").is_empty() => {
                t.count(file, "error", c.str("error"), 0);
                return Some(true); // an error was expected, and reported
            }
            Outcome::Invalid => {
                println!("FAIL {} error: reported an error for scores the corpus solves", c.str("tcId"));
                t.count(file, "error", "none", 1);
                return Some(false);
            }
            Outcome::Solved { p, tau, support } => {
                let rp = check_field(t, file, c, "p", &p, false);
                let rt = check_field(t, file, c, "tau", &[tau], rp == Some(false));
                let rs = check_field(t, file, c, "support", &[support as f64], rp == Some(false) || rt == Some(false));
                vec![rp, rt, rs]
            }
        }
    };
    if results.iter().all(Option::is_none) {
        return None;
    }
    Some(!results.contains(&Some(false)))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 2 {
        eprintln!("usage: {} CORPUS_DIR", args[0]);
        exit(2);
    }
    let mut t = Tallies::default();
    for file in ["entmax.jsonl", "entmax_vjp.jsonl"] {
        let cases = read_cases(format!("{}/{}", args[1], file)).unwrap_or_else(|e| {
            eprintln!("{}", e);
            exit(2)
        });
        for c in &cases {
            match check_case(&mut t, file, c) {
                Some(true) => t.passed += 1,
                Some(false) if c.str("verdict") == "acceptable" => t.acceptable += 1,
                Some(false) => t.failed += 1,
                None => t.skipped += 1,
            }
        }
    }
    println!("{}", t.report());
    exit(if t.failed > 0 || t.passed == 0 { 1 } else { 0 });
}
