"""The README and the license written into every corpus folder."""

from __future__ import annotations

#: what an implementation computes for each file (the README's table)
WHAT = {
    "entmax": "p = alpha-entmax(x), its threshold tau and its support size",
    "entmax_batch": "the same for rows of one length, each with its own alpha, in one call",
    "entmax_vjp": "dx = J(x)^T grad (from x, or from the p given)",
    "entmax_alpha_vjp": "dL/dalpha = sum_i grad_i dp_i/dalpha",
    "entmax_loss": "the Fenchel-Young loss for class target, and its gradient p - onehot",
    "normmax": "p = alpha-normmax(x), tau and support",
    "normmax_vjp": "dx = J(x)^T grad of alpha-normmax",
    "budget_sparsemax": "p = the projection of x onto {0 <= p <= 1, sum p = budget}, and its support",
    "budget_sparsemax_vjp": "dx = J(x)^T grad of budget-sparsemax",
    "asentmax_scale": "s = delta + beta log(n + offset)^gamma and ds/dbeta, ds/dgamma, ds/ddelta",
    "attention": "out of entmax attention, q (B, Hq, Nq, D), k (B, Hkv, Nk, D), v (B, Hkv, Nk, Dv)",
    "attention_vjp": "dq, dk, dv of entmax attention for grad_out",
    "attention_varlen": "out of packed sequences (q (total_q, Hq, D), cu_seqlens_q, cu_seqlens_k)",
    "attention_varlen_vjp": "dq, dk, dv of packed sequences",
}

LICENSE = """\
MIT License

Copyright (c) 2026 The entmax-ref authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""


def readme(manifest: dict) -> str:
    """The README of a corpus folder: what it is, its files, how to read, verify and pin it."""
    m = manifest
    rows = "\n".join(f"| `{f['file']}` | {f['cases']} | {WHAT[f['op']]} |" for f in m["files"])
    return f"""\
# entmax-ref conformance corpus, format {m['format_major']}.{m['format_minor']}

Expected values of alpha-entmax (softmax at alpha 1, 1.5-entmax, sparsemax at alpha 2 and every
alpha >= 1), its threshold and support, its gradients and loss, normmax, budget-sparsemax, the
ASEntmax scale and entmax attention (dense and packed, forward and backward), as JSON Lines that
a program in any language can read. Each expected value is the exact real-number answer,
correctly rounded to float64: rational arithmetic for sparsemax and budget-sparsemax, mpmath at
{m['oracle_digits'][0]} and {m['oracle_digits'][1]} digits otherwise, or more where a row's differences need them held
exactly (a value is written when both precisions round it alike). Each carries a tolerance
class that says how close a correct implementation must come.

Written by `{m['generator']}` (seed {m['seed']}, size {m['size']}): {m['row_cases']} row cases and
{m['attention_cases']} attention cases.

| file | cases | what an implementation computes |
|---|---|---|
{rows}

## Reading it

- One case per line, a JSON object. Every number is a string, twice: `NAME`, the shortest decimal
  that round-trips it in its dtype, and `NAME_hex`, the same value as a C99 hex float
  (`"0x1.8p-1"`, `"-inf"`, `"nan"`). Read `NAME_hex`: it is exact.
- `dtype` (float64, float32, float16, bfloat16) is the dtype the implementation under test works
  in; the inputs (the manifest's `inputs_in_dtype`) are values of that dtype, every other number
  is a float64 value.
- `tol` gives each expected field a class: `exact` (equal as float64) or `abs:@tol_F`
  (|got - expected| <= the bound in field `tol_F`, one per entry, one per row or one for all).
- `verdict` is `valid` (must match) or `acceptable` (one of several defensible answers, the flags
  say why: report a difference, do not fail on it). `error: "invalid-input"` marks rows with NaN or
  +inf scores: report an error, or return NaN.
- `tcId` is a digest of the case's inputs under a fixed serialisation (the manifest's
  `notes.tcId`): a list of known failures keyed by it survives a regeneration.
- `manifest.json` describes every file, flag, verdict and class; `schema/` holds a JSON Schema of
  each file's lines (draft 2020-12).

## Checking it

`sha256sum -c SHA256SUMS` checks every file but the manifest, whose `files` entries carry the
data files' digests too.

## Readers

`runners/` holds readers that check a short implementation of entmax and its gradient against
`entmax.jsonl` and `entmax_vjp.jsonl`: replace the implementation with yours. Each prints one
line per failing case (its tcId, the field and index, the value got and expected in hex, the
bound) and counts per file and class.

```
cc -std=c99 -O2 -o check_entmax runners/check_entmax.c -lm && ./check_entmax .
node runners/check_corpus.js .
cargo run --release --manifest-path runners/rust/Cargo.toml --example check_entmax -- .
```

## Pinning

Fetch this folder at a commit or a tag of the entmax-ref repository, for example with a sparse
checkout (`git sparse-checkout set corpus/v{m['format_major']}`). A reader refuses a
`format_major` it does not know; within a major a new `format_minor` only adds fields, flags,
files and cases, which a reader ignores. The manifest's `provenance` records the commit, date and
versions that wrote this copy.

## License

MIT (`LICENSE`), the license of entmax-ref.
"""
