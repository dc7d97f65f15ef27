"""The conformance corpus: the pinned corpus (corpus/v2), its format (numbers, ids, verdicts,
flags, classes, schemas), its oracles, its generation, reading and replay.

The fast tests read the pinned corpus and regenerate its cheap files (the ASEntmax scale, the
rows of several alphas, the packed attention) to compare their bytes; the ``slow`` ones
regenerate the whole corpus and compare every byte, validate every line against its schema
and replay it on numpy and numba.  The readers outside Python are tests/test_corpus_readers.py.
"""

from __future__ import annotations

import hashlib
import math
import json
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import entmax_ref as er
from entmax_ref.cli import main as cli_main
from entmax_ref.testing import CorpusError, load_corpus, replay_corpus
from entmax_ref.testing import conformance as C
from entmax_ref.testing import tolerance as T
from entmax_ref.testing.command import main as check_main
from entmax_ref.testing.conformance import exact as X
from entmax_ref.testing.conformance import fields as F
from entmax_ref.testing.conformance import lines as L
from entmax_ref.testing.conformance import sources as S
from entmax_ref.testing.conformance.operations import operation
from entmax_ref.testing.conformance.schema import validate_corpus
from entmax_ref.testing.conformance.validate import main as validate_main

ROOT = Path(__file__).resolve().parents[1]
PINNED = ROOT / "corpus" / "v2"
#: files that regenerate in seconds: the default tier compares their bytes with the pinned ones
CHEAP = ("entmax_batch", "asentmax_scale", "attention_varlen", "attention_varlen_vjp")


@pytest.fixture(scope="module")
def pinned():
    return load_corpus(PINNED)


@pytest.fixture(scope="module")
def cheap_corpus(shared_tmp):
    return shared_tmp("cheap-corpus", lambda d: C.generate_corpus(d, ops=CHEAP))


@pytest.fixture(scope="session")
def small_corpus(shared_tmp):
    return shared_tmp("small-corpus", lambda d: C.generate_corpus(d, seed=0, size="small"))


def _lines(path: Path) -> list:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def _cases(corpus, op):
    return corpus.cases[operation(op).file]


# ----------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_numbers_are_shortest_round_trip_strings_of_their_dtype(dtype):
    rng = np.random.default_rng(0)
    tiny = {"float64": 5e-324, "float32": 1e-45, "float16": 6e-8, "bfloat16": 1e-40}[dtype]
    vals = S.in_dtype(np.concatenate([rng.standard_normal(200) * 10.0 ** rng.integers(-6, 4, 200), [0.1, tiny, -0.0]]),
                      dtype)
    strs = C.nums(vals, dtype)
    assert np.array_equal(C.parse(strs, dtype), vals)
    for s, v in zip(strs, vals):  # no shorter decimal reads back as the same value of the dtype
        digits = len(s.lstrip("-").split("e")[0].replace(".", "").strip("0"))
        if digits > 1 and v != 0:
            assert S.in_dtype(np.array([float(f"{v:.{digits - 2}e}")]), dtype)[0] != v, (s, v)
    assert C.num(0.1, dtype) == "0.1" and C.num(1.0, dtype) == "1.0"
    assert [C.num(v) for v in (-np.inf, np.inf, np.nan)] == ["-inf", "inf", "nan"]


def test_bfloat16_rounding_is_to_nearest_even_with_float32_range():
    one = 1.0
    assert S.in_dtype(np.array([one + 2 ** -8, one + 3 * 2 ** -8, 2 ** -133, 2 ** -134, 3 * 2 ** -134, 1e39]),
                      "bfloat16").tolist() == [1.0, one + 2 ** -6, 2 ** -133, 0.0, 2 ** -132, np.inf]
    ml = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(1).standard_normal(10_000) * 10.0 ** np.random.default_rng(2).integers(-40, 38, 10_000)
    assert np.array_equal(S.in_dtype(x, "bfloat16"), x.astype(ml.bfloat16).astype(np.float64))


def test_hex_strings_are_exact_and_in_printf_form():
    rng = np.random.default_rng(1)
    vals = np.concatenate([rng.standard_normal(300) * 10.0 ** rng.integers(-300, 300, 300),
                           [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1]])
    for v in vals:
        h = L.hexnum(v)
        assert np.float64(float.fromhex(h)).tobytes() == np.float64(v).tobytes(), (v, h)
    assert [L.hexnum(v) for v in (0.75, 1.0, -0.0, 0.0, 5e-324)] == [
        "0x1.8p-1", "0x1p+0", "-0x0p+0", "0x0p+0", "0x0.0000000000001p-1022"]
    assert [L.hexnum(v) for v in (np.inf, -np.inf, np.nan)] == ["inf", "-inf", "nan"]
    assert L.hexnum(np.float32(0.1)) == "0x1.99999ap-4" and L.hexnum(np.float32(1e-45)) == "0x1p-149"


# ----------------------------------------------------------------------------- the oracles


def test_settle_rounds_correctly_decides_exact_zeros_and_midpoints():
    mp = pytest.importorskip("mpmath")
    lo_d, hi_d = X.base_digits()
    with mp.workdps(lo_d):
        a = mp.mpf(1) + mp.mpf(2) ** -53 * (1 + mp.mpf(10) ** -60)  # just above a midpoint: rounds up
        noise_lo = mp.mpf(10) ** -(lo_d - 2)  # what an exact 0 looks like at each precision
    with mp.workdps(hi_d):
        a_hi = mp.mpf(1) + mp.mpf(2) ** -53 * (1 + mp.mpf(10) ** -60)
        noise_hi = mp.mpf(10) ** -(hi_d - 2)
        mid_lo, mid_hi = mp.mpf(1) + mp.mpf(2) ** -53 + noise_lo, mp.mpf(1) + mp.mpf(2) ** -53 - noise_hi
    assert X.settle(a, a_hi) == np.nextafter(1.0, 2.0)
    assert X.settle(noise_lo, noise_hi) == 0.0 and X.settle(-noise_lo, noise_hi) == 0.0
    assert X.settle(mid_lo, mid_hi) == 1.0  # the midpoint 1 + 2^-53 itself: ties to even
    with pytest.raises(X.OracleError, match="rounds differently"):
        X.settle(mid_lo, mid_lo + mp.mpf(2) ** -52)
    # correct rounding into the subnormals (one rounding, not two)
    assert X.to_float(Fraction(3, 2 ** 1075)) == 2 * 2.0 ** -1074 and X.to_float(Fraction(1, 2 ** 1075)) == 0.0
    with mp.workdps(lo_d):
        assert X.to_float(mp.mpf(2) ** -1_000_000) == 0.0  # far below float64: no huge rational


def test_settle_rounds_a_midpoint_approached_from_one_side_and_keeps_every_bit():
    mp = pytest.importorskip("mpmath")
    lo_d, hi_d = X.base_digits()
    with mp.workdps(lo_d):
        mid = mp.mpf(1) + mp.mpf(2) ** -53  # between 1 (even) and 1 + 2^-52
        above_lo = mid + mp.mpf(10) ** -(lo_d - 2)  # 11^8 (g_3 - sum g / 11) at 1/11 rounded: a midpoint
        just_above = mp.mpf(1) + mp.mpf(2) ** -24 + mp.mpf(2) ** -60  # 2^-60 above a float32 midpoint
    with mp.workdps(hi_d):
        above_hi = mid + mp.mpf(10) ** -(hi_d - 2)
    # the midpoint itself, approached from above at both precisions (settled at mpmath's default
    # 15 digits: the values keep their own bits, not rounded to 53 bits first)
    assert X.settle(above_lo, above_hi) == 1.0
    from entmax_ref.testing.oracle import round_cr

    assert round_cr(just_above, just_above, np.float32) == np.nextafter(np.float32(1), np.float32(2))
    with mp.workdps(400):  # an exact 0 held to 350 digits: noise below float64's range, of either sign
        tiny_lo, tiny_hi = -mp.mpf(10) ** -351, -mp.mpf(10) ** -391
        negative = -mp.mpf(10) ** -400
    assert math.copysign(1.0, X.settle(tiny_lo, tiny_hi)) == 1.0
    assert math.copysign(1.0, X.settle(negative, negative)) == -1.0  # a tiny negative value rounds to -0


def test_sparsemax_oracle_is_exact_and_gives_the_real_number_support():
    # the row of the exactness issue: support 3, p = [1/2 - d/3, 0, 2d/3, 1/2 - d/3, 0, 0], d = 2^-54
    x = np.array([0.0, -0.5000000000000001, -0.49999999999999994, 0.0, -0.5, -1.5])
    d = Fraction(1, 2 ** 54)
    ans = X.RowOracle().row(x, 2.0)
    assert ans.p.tolist() == [float(v) for v in (Fraction(1, 2) - d / 3, 0, 2 * d / 3, Fraction(1, 2) - d / 3, 0, 0)]
    assert ans.support == 3 and ans.p[2] > 0 and ans.on.tolist() == [1, 0, 1, 1, 0, 0]
    assert ans.tau == float(-Fraction(1, 2) + d / 3) == ans.theta  # (0 + 0 + x[2] - 1) / 3


@pytest.mark.parametrize("alpha", [1.0, 1.25, 1.5, 3.0])
def test_row_oracle_agrees_with_the_reference_and_sums_to_one(alpha):
    x = np.random.default_rng(3).standard_normal(12) * 2
    ans = X.RowOracle().row(x, alpha)
    p, info = er.entmax(x[None], alpha, backend="numpy", return_info=True)
    assert np.allclose(ans.p, p[0], rtol=0, atol=4e-15) and abs(ans.tau - info.tau[0]) < 1e-13
    assert ans.support == int((p[0] > 0).sum()) and abs(ans.p.sum() - 1) < 1e-15


#: rows with an entry a difference of 1e-158 or 5e-324 above the threshold: held exactly only at
#: more than 160 (330) digits, they sit on the threshold at a fixed 80 or 120.  (x, alpha,
#: the support, p as the correctly rounded float64 values)
TINY_DIFFERENCE_ROWS = [
    # p = [e, 1 - e] exactly (q = e solves (1 - q)^2 = 1 - 2e + q^2), tau = -1 - e^2
    ([-0.5, -1.431366025724674e-158], 3.0, 2, [1.431366025724674e-158, 1.0]),
    # sqrt(p) = [u, u + 1 - e/2]: p[0] = (e/2)^2 (1 + O(e)) = 2.5e-317, a subnormal
    ([-2.0, -1e-158], 1.5, 2, [float(Fraction(1e-158) ** 2 / 4), 1.0]),
    # the same with e = 2^-1074: p[0] = 2^-2150 (1 + O(e)) rounds to 0, inside the support
    ([-2.0, -5e-324], 1.5, 2, [0.0, 1.0]),
]


@pytest.mark.parametrize("x, alpha, support, p", TINY_DIFFERENCE_ROWS)
def test_row_oracle_keeps_an_entry_a_tiny_difference_above_the_threshold(x, alpha, support, p):
    pytest.importorskip("mpmath")
    from entmax_ref.testing.oracle import entmax_cr

    ans = X.RowOracle().row(np.array(x), alpha)
    assert ans.support == support and ans.on.all() and ans.p.tolist() == p and ans.tau == -1.0
    want = entmax_cr(np.array(x), alpha)
    assert ans.p.tobytes() == want[0].tobytes() and (ans.tau, ans.support) == want[1:]


def test_row_oracle_derived_values_see_a_tiny_support_entry():
    # u = 1/p = [1/e, 1/(1 - e)] at alpha 3: dx = u (g - <u, g> / sum u) = [g0 - g1, g1 - g0] exactly
    mp = pytest.importorskip("mpmath")
    x, g = np.array([-0.5, -1.431366025724674e-158]), [1.0, 0.25]
    dx = X.RowOracle().derived(x, 3.0, lambda p, T_, d: X.vjp_exact(mp, p, g, 3.0))
    assert dx.tolist() == [0.75, -0.75]


def test_row_oracle_alpha_vjp_keeps_the_difference_of_two_1e133_terms():
    # alpha = 10, an entry one ulp above the threshold of two equal maxima: p = 2e-17, u = p^-8 =
    # 4e132; p c and u <p, c> / sum u agree to 133 digits, their difference is O(1).  The
    # reference sums the unshifted form at 400 digits
    mp = pytest.importorskip("mpmath")
    b = -(0.5 ** 9 / 9)
    x = np.array([0.0, np.nextafter(b, 1.0), b - 1.0, np.nextafter(b, -1.0), b, 0.0])
    g = [0.5, -1.25, 0.75, 2.0, -0.375, 1.0]
    with mp.workdps(400):
        from entmax_ref.testing.oracle import entmax_mp

        p, _ = entmax_mp(x, 10.0, dps=400)
        ell = [mp.log(e) if e > 0 else mp.mpf(0) for e in p]
        c = [-li ** 2 * (mp.expm1(-9 * li) - -9 * li) / (-9 * li) ** 2 if li else mp.mpf(0) for li in ell]
        u = [e ** -8 if e > 0 else mp.mpf(0) for e in p]
        m = mp.fdot(p, c) / mp.fsum(u)
        want = float(mp.fsum(gi * (e * ci - ui * m) for gi, e, ci, ui in zip(g, p, c, u)))
    assert 0 < p[1] < 1e-16 and abs(want) > 0.01
    assert X.RowOracle().derived(x, 10.0, lambda p, T_, d: X.alpha_vjp_exact(mp, p, g, 10.0)) == want


#: c = 1 + 3 2^-50: 9 c = 9 + 13.5 2^-49 is a float64 rounding midpoint (ties to even: up)
EDGE_C = 1.0 + 3.0 * 2.0 ** -50


@pytest.mark.parametrize("gap", [1e-12, 1e-15])
def test_row_oracle_rounds_a_tau_just_below_a_midpoint_down(gap):
    # alpha = 10: the edge entry c has p = q (~gap) and tau = 9 c - q^9, q^9 ~ 1e-108 or 1e-135
    # below the midpoint 9 c: at 80 and 120 digits the two round differently (1e-12) or both
    # take the midpoint and round it to even (1e-15); tau rounds down to 9 + 13 2^-49
    pytest.importorskip("mpmath")
    from entmax_ref.testing.oracle import entmax_cr

    x = np.array([EDGE_C + 1.0 / 9.0 - gap, EDGE_C, EDGE_C - 0.5])
    ans = X.RowOracle().row(x, 10.0)
    assert ans.tau == 9.0 + 13.0 * 2.0 ** -49 and ans.theta == EDGE_C
    assert ans.support == 2 and 0 < ans.p[1] < 2 * gap and ans.p[2] == 0.0
    want = entmax_cr(x, 10.0)
    assert ans.p.tobytes() == want[0].tobytes() and (ans.tau, ans.support) == want[1:]


def test_normmax_vjp_names_the_normmax_files_p_on_a_tiny_difference_row():
    # [-2^-600, -1]: the top alone puts tau at -1 - 2^-600, so -1 is 2^-600 above it, p = 4.9e-91
    # at alpha 3; a 50-digit oracle holds -1 + 2^-600 as -1 and leaves it out
    pytest.importorskip("mpmath")
    from entmax_ref.testing.conformance.gen_family import gen_normmax, gen_normmax_vjp

    x = np.array([-(2.0 ** -600), -1.0, -3.0])
    row = S.Row("huge-offset", "an entry 2^-600 above the threshold", x, dtypes=("float64",))
    ctx = S.Context("small", 0, X.RowOracle(), rows=[row])

    def mine(gen):
        return {(c["alpha"], c["dtype"]): c["p"] for c in gen(ctx) if c["kind"] == "huge-offset" and c["n"] == 3}

    p, p_vjp = mine(gen_normmax), mine(gen_normmax_vjp)
    assert len(p) == 6 and p == p_vjp
    assert float(p["3.0", "float64"][1]) > 0


def test_unmasked_zeros_may_round_to_a_subnormal():
    # exp(-745.5) rounds to 0 in float64; an implementation that computes exp(-745) / sum gets
    # 2^-1074: a masked entry must be 0, an underflowed one may be the smallest subnormal
    p = np.array([[0.6, 0.0, 0.0, 0.4]])
    tol = T.entmax_tolerance(p, 1.0, "float64", masked=np.array([[False, False, True, False]]))
    assert tol[0, 1] == np.finfo(np.float64).tiny and tol[0, 2] == 0.0


# ----------------------------------------------------------------------------- the pinned corpus


def test_pinned_corpus_checksums_license_readme_and_provenance(pinned):
    m = pinned.manifest
    assert (m["format_major"], m["format_minor"]) == (C.FORMAT_MAJOR, C.FORMAT_MINOR) == (2, 0)
    assert (m["seed"], m["size"], m["generator"]) == (0, "small", f"entmax-ref {er.__version__}")
    assert repr(pinned).startswith(f"Corpus('{PINNED}', format 2.0, {len(pinned)} cases: entmax.jsonl ")
    assert len(repr(pinned)) < 600
    sums = dict(reversed(ln.split("  ")) for ln in (PINNED / "SHA256SUMS").read_text().splitlines())
    listed = {p.relative_to(PINNED).as_posix() for p in PINNED.rglob("*") if p.is_file()}
    assert set(sums) == listed - {"SHA256SUMS", "manifest.json"} - {
        p for p in listed if "/target/" in p or p.endswith("Cargo.lock")}
    for name, digest in sums.items():
        assert hashlib.sha256((PINNED / name).read_bytes()).hexdigest() == digest, name
    assert (PINNED / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    readme = (PINNED / "README.md").read_text()
    assert "sha256sum -c SHA256SUMS" in readme and "cargo run --release" in readme and "MIT" in readme
    prov = m["provenance"]
    assert set(prov) >= {"date", "python", "numpy", "mpmath", "platform"}
    assert sum(f.stat().st_size for f in PINNED.glob("*.jsonl")) < 10.5e6  # about 10 MB at most


def test_pinned_corpus_names_a_commit_of_this_history(pinned):
    """The provenance's commit is one this checkout descends from, written from its committed
    files: a corpus regenerated and then rebased names a commit that no longer exists."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    if _git(git, "rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("a shallow clone: the history is not here")
    prov = pinned.manifest["provenance"]
    assert prov["source"] == "committed"
    assert _git(git, "merge-base", "--is-ancestor", prov["commit"], "HEAD").returncode == 0, (
        f"corpus/v2 names commit {prov['commit']}, which HEAD does not descend from: regenerate it "
        "(entmax-ref corpus --out corpus/v2) from a committed tree")


def _git(git, *args):
    return subprocess.run([git, "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)


def test_pinned_corpus_is_what_the_generator_writes_for_the_cheap_files(cheap_corpus):
    for op in CHEAP:
        f = operation(op).file
        assert (cheap_corpus / f).read_bytes() == (PINNED / f).read_bytes(), (
            f"{f} differs from the generator's: regenerate with entmax-ref corpus --out corpus/v2")
    for sub in ("schema", "runners"):
        for p in (cheap_corpus / sub).rglob("*"):
            if p.is_file():
                assert p.read_bytes() == (PINNED / p.relative_to(cheap_corpus)).read_bytes(), p


@pytest.mark.slow
def test_pinned_corpus_regenerates_byte_for_byte(small_corpus, tmp_path):
    assert C.compare_corpora(PINNED, small_corpus) == []
    # and a change is found: one byte, a missing file, an extra one
    d = tmp_path / "c"
    shutil.copytree(small_corpus, d)
    (d / "attention.jsonl").write_bytes((d / "attention.jsonl").read_bytes().replace(b'"1.5"', b'"1.6"', 1))
    (d / "normmax.jsonl").unlink()
    (d / "extra.txt").write_text("")
    assert C.compare_corpora(small_corpus, d) == [
        "normmax.jsonl: only in " + str(small_corpus), f"extra.txt: only in {d}", "attention.jsonl: the bytes differ"]


def test_every_line_conforms_hex_agrees_with_decimal_and_ids_recompute(pinned):
    """Every case of the pinned corpus: the hex and decimal forms are the same value (the
    decimal read in the case's dtype for inputs), the tcId recomputes from the case under the
    documented serialisation (and is unique), a tol_ field is present exactly when its class
    names it, and the groups are contiguous."""
    count = 0
    for f in pinned.manifest["files"]:
        op, seen = f["op"], set()
        assert f["id_fields"] == list(F.id_fields(op))
        cases = pinned.cases[f["file"]]
        for c in cases:
            for fld in F.numeric(op):
                if fld.name not in c:
                    assert fld.role == "tol" and c["tol"][fld.name[4:]] == "exact"
                    continue
                if c[fld.name] is None:
                    assert c[fld.name + "_hex"] is None
                    continue
                dt = c["dtype"] if fld.role == "in" else "float64"
                dec, hexed = C.parse(c[fld.name], dt), L.value(c, fld.name, "float64")
                assert dec.tobytes() == hexed.tobytes(), (c["tcId"], fld.name)
                count += dec.size
            key = {name: c.get(name + "_hex", c.get(name)) for name in f["id_fields"]}
            text = json.dumps([op, key], sort_keys=True, separators=(",", ":"))
            assert c["tcId"] == f"{op}-{hashlib.sha256(text.encode()).hexdigest()[:12]}" not in seen
            seen.add(c["tcId"])
            for out in F.outputs(op):
                assert (c["tol"][out] == f"abs:@tol_{out}") == (f"tol_{out}" in c)
            assert set(c["flags"]) <= set(L.FLAGS) and c["verdict"] in L.VERDICTS
        for g in f["groups"]:
            group = cases[g["first"] - 1:g["first"] - 1 + g["cases"]]
            assert all(c["dtype"] == g["dtype"] and c.get(g["param"]) == g["value"] for c in group if g["param"])
        assert sum(g["cases"] for g in f["groups"]) == len(cases)
    assert count > 250_000


def test_the_documented_id_example_recomputes(pinned):
    doc = (ROOT / "docs" / "corpus.md").read_text()
    c = pinned.cases["asentmax_scale.jsonl"][0]
    assert c["tcId"] in doc and L.id_text("asentmax_scale", c) in doc


def test_schemas_validate_the_first_lines_and_reject_a_bad_line(tmp_path):
    # jsonschema takes ~0.1 s per attention line: the default tier checks the first lines of
    # each file; CI and the slow test check every line
    assert validate_corpus(PINNED, limit=8) > 100
    d = tmp_path / "c"
    shutil.copytree(PINNED, d, ignore=shutil.ignore_patterns("target", "Cargo.lock"))
    path = d / "entmax.jsonl"
    lines = path.read_text().splitlines()
    c = json.loads(lines[4])
    c["x_hex"][0] = "0x1.8"  # no exponent: not a C99 hex float
    lines[4] = json.dumps(c)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=r"entmax.jsonl:5: x_hex/0: '0x1.8' does not match"):
        validate_corpus(d)
    c["x_hex"][0] = json.loads(lines[5])["x_hex"][0]
    c["tol_tau"] = "0.0"  # a bound whose class is not abs:@tol_tau
    c["tol"]["tau"] = "exact"
    lines[4] = json.dumps(c)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=r"entmax.jsonl:5: "):
        validate_corpus(d)
    del c["tcId"]
    lines[4] = json.dumps(c)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=r"entmax.jsonl:5: .*is a required property"):
        validate_corpus(d)
    assert validate_main([str(d)]) == 1


@pytest.mark.slow
def test_every_line_of_the_pinned_corpus_conforms_to_its_schema():
    assert validate_corpus(PINNED) == 1 + sum(f["cases"] for f in json.loads(
        (PINNED / "manifest.json").read_text())["files"])


def test_pinned_corpus_covers_the_hard_cases(pinned):
    rows = _cases(pinned, "entmax")
    kinds = {c["kind"] for c in rows}
    assert {"near-ties", "support-boundary", "huge-offset", "masks", "all-masked", "long", "found-by-hypothesis",
            "alpha-far-above-2", "subnormal", "non-finite"} <= kinds
    assert {1.0, 1.000001, 1.25, 1.5, 2.0, 3.0, 10.0, 100.0, 1000.0} <= {float(c["alpha"]) for c in rows}
    assert {"float64", "float32", "float16", "bfloat16"} == {c["dtype"] for c in rows}
    # the row: the real-number support, an entry of 3.7e-17
    boundary = [c for c in rows if c["kind"] == "support-boundary" and c["alpha"] == "2.0" and c["dtype"] == "float64"]
    assert any(c["support"] == 3 and "3.700743415417188e-17" in c["p"] for c in boundary)
    (row,) = [c for c in boundary if c["x_hex"] == ["0x0p+0", "-0x1.0000000000001p-1", "-0x1.fffffffffffffp-2",
                                                    "0x0p+0", "-0x1p-1", "-0x1.8p+0"]]
    assert row["support"] == 3 and row["p"] == ["0.5", "0.0", "3.700743415417188e-17", "0.5", "0.0", "0.0"]
    assert row["tol"]["support"] == "exact"  # no entry may be decided either way: its p is correctly rounded
    assert all(c["support"] == sum(v != "0.0" for v in c["p"]) for c in boundary)
    errors = [c for c in rows if c["error"]]
    assert errors and all(c["kind"] == "non-finite" and c["error"] == "invalid-input" and c["tau"] == "nan"
                          and c["support"] == 0 and set(c["p"]) == {"nan"} for c in errors)
    assert {"subnormal", "ill-posed", "per-row-alpha", "per-head-alpha", "long-keys", "varlen", "grouped-query",
            "asentmax", "non-finite"} <= {f for cases in pinned.cases.values() for c in cases for f in c["flags"]}
    assert {c["verdict"] for c in _cases(pinned, "entmax_vjp")} == {"valid", "acceptable"}
    # the float64 rows (normmax's too) are correctly rounded: p and tau exact, their support
    # exact but for entries whose probability rounds to 0
    for c in rows + _cases(pinned, "entmax_batch") + _cases(pinned, "normmax"):
        if c["dtype"] == "float64" and not c.get("error"):
            assert c["tol"]["p"] == c["tol"]["tau"] == "exact" and "tol_p" not in c and "tol_tau" not in c
            zeros = np.sum(np.asarray(c["p"]) == "0.0") - np.sum(np.asarray(c["x"]) == "-inf")
            assert np.all(np.asarray(c.get("tol_support", 0)) <= zeros)
    assert all("ill-posed" in c["flags"] for cases in pinned.cases.values() for c in cases
               if c["verdict"] == "acceptable")
    batch = _cases(pinned, "entmax_batch")
    assert batch and all(len(set(c["alpha"])) > 1 and len(c["x"]) == len(c["alpha"]) == len(c["support"])
                         for c in batch)
    attn = _cases(pinned, "attention") + _cases(pinned, "attention_vjp")
    long = [c for c in attn if c["shape"]["Nk"] >= 192 and c["shape"]["D"] == 64]
    assert long and any(c["shape"]["Nk"] >= 256 for c in long) and any(c["shape"]["Hq"] > c["shape"]["Hkv"] for c in long)
    assert any(isinstance(c["alpha"], list) for c in attn)
    assert any(c["beta"] is not None and np.ndim(c["beta"]) == 3 and c["offset"] != "1.0" and c["delta"] != "1.0"
               for c in attn)
    assert {"float64", "float32", "float16"} <= {c["dtype"] for c in attn}
    varlen = _cases(pinned, "attention_varlen")
    assert any(0 in np.diff(c["cu_seqlens_k"]) and 0 in np.diff(c["cu_seqlens_q"]) for c in varlen)


def test_constructed_cases_do_not_depend_on_the_seed():
    a, b = S.row_sources("small", 0), S.row_sources("small", 1)
    assert len(a) == len(b)
    for r, s in zip(a, b):
        assert r.kind == s.kind
        same = r.x.tobytes() == s.x.tobytes()
        assert same == (r.kind not in S.RANDOM_KINDS), r.kind
    # what a case draws (an upstream gradient, a target) is a function of the case alone
    x = a[0].x
    assert np.array_equal(S.case_rng("grad", x, 1.5, "float32").standard_normal(3),
                          S.case_rng("grad", x.copy(), 1.5, "float32").standard_normal(3))


@pytest.mark.slow
def test_ids_of_constructed_cases_are_the_same_with_another_seed(tmp_path, pinned):
    C.generate_corpus(tmp_path, seed=1, ops=("entmax", "entmax_vjp"))
    for f in ("entmax.jsonl", "entmax_vjp.jsonl"):
        ids = {c["tcId"]: c["kind"] for c in pinned.cases[f]}
        other = {c["tcId"]: c["kind"] for c in _lines(tmp_path / f)}
        constructed = {i for i, k in ids.items() if k not in S.RANDOM_KINDS}
        assert constructed == {i for i, k in other.items() if k not in S.RANDOM_KINDS}
        assert not {i for i, k in ids.items() if k in S.RANDOM_KINDS} & set(other)


# ----------------------------------------------------------------------------- loading


def _copy(tmp_path) -> Path:
    d = tmp_path / "c"
    shutil.copytree(PINNED, d, ignore=shutil.ignore_patterns("target", "Cargo.lock", "attention*", "normmax*",
                                                             "budget*", "entmax_vjp*", "entmax_loss*",
                                                             "entmax_alpha*"))
    m = json.loads((d / "manifest.json").read_text())
    m["files"] = [f for f in m["files"] if (d / f["file"]).exists()]
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def _reseal(d: Path, name: str, data: bytes) -> None:
    """Write ``data`` as file ``name`` and update its digest and count in the manifest."""
    (d / name).write_bytes(data)
    m = json.loads((d / "manifest.json").read_text())
    for f in m["files"]:
        if f["file"] == name:
            f["sha256"], f["cases"] = hashlib.sha256(data).hexdigest(), data.count(b"\n")
    (d / "manifest.json").write_text(json.dumps(m))


def test_load_corpus_rejects_edits_versions_missing_and_malformed_files(tmp_path):
    d = _copy(tmp_path)
    assert len(load_corpus(d)) == sum(f["cases"] for f in json.loads((d / "manifest.json").read_text())["files"])
    with pytest.raises(CorpusError, match="no manifest.json"):
        load_corpus(tmp_path)
    good = (d / "entmax_batch.jsonl").read_bytes()
    (d / "entmax_batch.jsonl").write_bytes(good.replace(b'"1.5"', b'"1.6"', 1))
    with pytest.raises(CorpusError, match="SHA-256"):
        load_corpus(d)
    # checksums that match content that does not parse: a cut line, bad UTF-8, not an object
    lines = good.split(b"\n")
    _reseal(d, "entmax_batch.jsonl", b"\n".join([lines[0], lines[1][:300]] + lines[2:]))
    with pytest.raises(CorpusError, match=r"entmax_batch.jsonl:2: not JSON"):
        load_corpus(d)
    _reseal(d, "entmax_batch.jsonl", b"\n".join([lines[0], b'"\xff\xfe"'] + lines[2:]))
    with pytest.raises(CorpusError, match=r"entmax_batch.jsonl:2: not UTF-8"):
        load_corpus(d)
    _reseal(d, "entmax_batch.jsonl", b"\n".join([lines[0], b"[1, 2]"] + lines[2:]))
    with pytest.raises(CorpusError, match=r"entmax_batch.jsonl:2: a case is a JSON object, not a list"):
        load_corpus(d)
    _reseal(d, "entmax_batch.jsonl", good)
    m = json.loads((d / "manifest.json").read_text())
    for bad, match in (({**m, "format_major": 99}, "corpus format 99; this entmax-ref reads formats 1, 2"),
                       (m["files"], "a manifest is a JSON object, not a list"),
                       ({**m, "files": [{k: v for k, v in f.items() if k != "sha256"} for f in m["files"]]},
                        r"files\[0\] has no 'sha256'"),
                       ({**m, "files": "entmax.jsonl"}, "'files' is not a list")):
        (d / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(CorpusError, match=match):
            load_corpus(d)
    (d / "manifest.json").write_bytes(b"\xff")
    with pytest.raises(CorpusError, match=r"manifest.json: not UTF-8"):
        load_corpus(d)
    (d / "manifest.json").write_text(json.dumps(m))
    (d / "entmax.jsonl").unlink()
    with pytest.raises(CorpusError, match="missing"):
        load_corpus(d)
    # the command says it in one line, exit 2
    assert check_main(["--corpus", str(d), "--backends", "numpy", "--no-peers"]) == 2


# ----------------------------------------------------------------------------- replay


def test_replay_checks_p_tau_and_support_and_records_every_case(pinned):
    rep = C.replay_backend(pinned, "numpy", ops=("entmax", "entmax_batch", "normmax", "budget_sparsemax"))
    assert rep.ok, rep.table()
    rows = {(r.op, r.dtype): r for r in rep.rows}
    r = rows["corpus entmax", "float64"]
    n = sum(c["dtype"] == "float64" for c in _cases(pinned, "entmax"))
    assert r.counts() == (n, 0, 0) and len({c["tcId"] for c in r.cases}) == n
    rec = r.cases[0]
    assert set(rec) >= {"tcId", "verdict", "field", "worst", "error", "bound"} and rec["verdict"] == "PASS"
    assert {c["field"] for c in r.cases} == {"p", "tau", "support", "error"}  # a record per case and output
    assert {"float16", "bfloat16"} <= {dt for _, dt in rows}

    def wrong_support(x, alpha):  # the library's p and tau, the support of the entries >= 0
        p, info = er.entmax(x, alpha, backend="numpy", return_info=True)
        return p, info.tau, (p >= 0).sum(axis=-1)

    def wrong_tau(x, alpha):
        p, info = er.entmax(x, alpha, backend="numpy", return_info=True)
        return p, info.tau + 1e-9, info.support

    for fn, field in ((wrong_support, "support"), (wrong_tau, "tau")):
        bad = replay_corpus(pinned, fn, "entmax", dtypes=("float64",))
        fails = [c for r in bad.rows for c in r.cases if c["verdict"] == "FAIL"]
        assert not bad.ok and fails and {c["field"] for c in fails} == {field}
        # each failing case as the readers outside Python print it: got and expected in hex, the bound
        by_id = {c["tcId"]: c for c in _cases(pinned, "entmax")}
        for rec in fails:
            case, i = by_id[rec["tcId"]], rec["worst"][0]
            exp = L.value(case, field)
            assert float.fromhex(rec["expected"]) == exp.reshape(-1)[i] != float.fromhex(rec["got"])
            assert rec["error"] == abs(float.fromhex(rec["got"]) - float.fromhex(rec["expected"])) > rec["bound"]

    def p_only(x, alpha):  # its support is counted from p: a wrong p is caught on p
        return er.entmax(x, alpha, backend="numpy")

    assert replay_corpus(pinned, p_only, "entmax").ok


def test_error_cases_pass_when_the_call_raises_and_fail_when_it_answers(pinned):
    rep = C.replay_backend(pinned, "numpy", ops=("entmax",))
    recs = [c for r in rep.rows for c in r.cases if c["field"] == "error"]
    assert recs and all(c["verdict"] == "PASS" for c in recs)

    def no_checks(x, alpha):
        return er.entmax(np.nan_to_num(x, nan=0.0, posinf=0.0), alpha, backend="numpy")

    bad = replay_corpus(pinned, no_checks, "entmax")
    errs = {c["tcId"] for c in _cases(pinned, "entmax") if c["error"]}
    assert {c["verdict"] for r in bad.rows for c in r.cases if c["tcId"] in errs} == {"FAIL"}


def test_acceptable_cases_are_compared_and_their_differences_do_not_fail(pinned):
    def from_x(x, grad, alpha):  # the VJP at x: at an ill-posed x its one-sided answer may differ
        p = er.entmax(x, alpha, backend="numpy")
        return er.entmax_vjp(p, grad, alpha, backend="numpy") * 1.01

    rep = replay_corpus(pinned, from_x, "entmax_vjp", dtypes=("float64",))
    verdicts = {c["verdict"] for r in rep.rows for c in r.cases}
    acceptable = {c["tcId"] for c in _cases(pinned, "entmax_vjp") if c["verdict"] == "acceptable"}
    assert "FAIL" in verdicts and "ACCEPTABLE" in verdicts
    assert {c["tcId"] for r in rep.rows for c in r.cases if c["verdict"] == "ACCEPTABLE"} <= acceptable


def test_check_command_filters_by_alpha_and_writes_one_record_per_case(pinned, tmp_path, monkeypatch, capsys):
    (tmp_path / "user_sparsemax.py").write_text(
        "import entmax_ref as er\n"
        "def sparsemax(x):\n    return er.entmax(x, 2.0, backend='numpy')\n"
        "def attn(q, k, v, **kw):\n    return er.attention(q, k, v, backend='numpy', **kw)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["--corpus", str(PINNED), "--impl", "user_sparsemax:sparsemax", "--op", "entmax", "--no-progress"]
    assert check_main(args) == 1  # every softmax case "fails" a sparsemax
    capsys.readouterr()
    out = tmp_path / "report.json"
    assert check_main(args + ["--alpha", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    n = sum(c["alpha"] == "2.0" for c in _cases(pinned, "entmax"))
    assert f"{n} of {len(_cases(pinned, 'entmax'))} cases selected (--alpha 2" in text
    recs = [c for r in json.loads(out.read_text())["rows"] for c in r["cases"]]
    assert len({c["tcId"] for c in recs}) == n and {c["verdict"] for c in recs} == {"PASS"}
    assert all(set(c) >= {"tcId", "verdict", "field", "worst", "error", "bound"} for c in recs)
    assert check_main(["--corpus", str(PINNED), "--impl", "user_sparsemax:attn", "--op", "attention_varlen",
                       "--no-progress"]) == 1  # attention() is not the packed form


def test_check_command_replays_the_backends_on_the_selected_dtypes_and_alphas(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert check_main(["--corpus", str(PINNED), "--backends", "numpy", "--no-peers", "--no-progress",
                       "--dtype", "float16", "--alpha", "2", "--json", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["cases"]]
    assert rows and {r["dtype"] for r in rows} == {"float16"}
    by_id = {c["tcId"]: c for cases in _load_all(PINNED) for c in cases}
    alphas = {float(a) for r in rows for c in r["cases"] for a in np.ravel(by_id[c["tcId"]].get("alpha", "2"))}
    assert alphas == {2.0}


def _load_all(d: Path):
    return [_lines(p) for p in sorted(d.glob("*.jsonl"))]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["numpy", pytest.param("numba", marks=pytest.mark.numba)])
def test_pinned_corpus_replays_without_failures(pinned, name):
    if er.backends.unavailable_reason(name):
        pytest.skip(er.backends.unavailable_reason(name))
    rep = C.replay_backend(pinned, name)
    assert rep.ok, rep.table()
    assert {f"corpus {op}" for op in C.OPS} == {r.op for r in rep.rows}
    assert all(c["verdict"] == "PASS" for r in rep.rows for c in r.cases)


def test_replay_of_the_cheap_files_on_numpy(pinned):
    rep = C.replay_backend(pinned, "numpy", ops=CHEAP)
    assert rep.ok, rep.table()


# ----------------------------------------------------------------------------- the command


def test_corpus_command_usage_errors_check_and_provenance(tmp_path, capsys):
    assert cli_main(["corpus", "--out", str(tmp_path), "--size", "huge"]) == 2
    assert cli_main(["corpus", "--out", str(tmp_path), "--ops", "bogus"]) == 2
    assert "unknown corpus operation" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert cli_main(["corpus", "--out", str(tmp_path / "file"), "--ops", "asentmax_scale"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    out = tmp_path / "c"
    assert cli_main(["corpus", "--out", str(out), "--ops", "asentmax_scale", "--seed", "5"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["seed"] == 5 and len(m["provenance"]["commit"]) == 40 and m["provenance"]["source"] in (
        "committed", "modified")
    assert cli_main(["corpus", "--check", str(out)]) == 0
    assert "every byte of its" in capsys.readouterr().out
    (out / "asentmax_scale.jsonl").write_bytes((out / "asentmax_scale.jsonl").read_bytes()[:-1])
    assert cli_main(["corpus", "--check", str(out)]) == 1
    assert "asentmax_scale.jsonl: the bytes differ" in capsys.readouterr().err
    assert cli_main(["corpus", "--check", str(tmp_path / "nothing")]) == 2


def test_missing_mpmath_names_the_extra(tmp_path, monkeypatch):
    import re

    monkeypatch.setitem(sys.modules, "mpmath", None)
    with pytest.raises(ModuleNotFoundError, match=re.escape('pip install "entmax-ref[corpus]"')):
        C.generate_corpus(tmp_path, ops=("attention",))


def test_a_format_1_corpus_still_replays(tmp_path):
    m = json.loads((PINNED / "manifest.json").read_text())
    dst = tmp_path / "v1"
    dst.mkdir()
    files = []
    for f in m["files"]:
        if f["op"] != "asentmax_scale":
            continue
        out = []
        for i, c in enumerate(_lines(PINNED / f["file"]), 1):
            c = {k: v for k, v in c.items() if not k.endswith("_hex") and k not in ("schema", "tcId", "flags", "tol",
                                                                                  "verdict")}
            bounds = {f"tol_{o}": "0.0" for o in F.outputs(f["op"])}  # format 1 has every bound
            out.append(json.dumps({"id": f"{f['op']}-{i:05d}", **bounds, **c}, separators=(",", ":")) + "\n")
        data = "".join(out).encode()
        (dst / f["file"]).write_bytes(data)
        files.append({"file": f["file"], "op": f["op"], "cases": len(out), "sha256": hashlib.sha256(data).hexdigest()})
    (dst / "manifest.json").write_text(json.dumps({"format": m["format"], "schema_version": 1, "files": files}))
    corpus = load_corpus(dst)
    assert corpus.format == 1
    rep = C.replay_backend(corpus, "numpy", ops=("asentmax_scale",))
    assert rep.ok and len(rep.rows) == 1, rep.table()
