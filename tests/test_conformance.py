"""The conformance corpus (``entmax-ref corpus``): files, schemas, hex form, ids, determinism,
loading, replay, and the readers in C and JavaScript.

The fast tests write only the cheap files (the ASEntmax scale and the attention cases) and a
small entmax file of a few rows (for the C and JavaScript readers); the ``slow`` ones write the
whole small corpus once (the 50-digit oracle checks every row case, about a minute), validate
it and replay it on numpy and numba.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import entmax_ref as er
from entmax_ref.testing.tolerance import ORACLE_ATOL
from entmax_ref.cli import main as cli_main
from entmax_ref.testing import CorpusError, load_corpus, replay_corpus
from entmax_ref.testing import conformance as C
from entmax_ref.testing.conformance import fields as F
from entmax_ref.testing.conformance import lines as L
from entmax_ref.testing.conformance import write as W
from entmax_ref.testing.conformance.schema import validate_corpus
from entmax_ref.testing.conformance.validate import main as validate_main
from entmax_ref.testing.command import main as check_main

ROOT = Path(__file__).resolve().parents[1]
CHEAP = ("asentmax_scale", "attention", "attention_vjp")
FAMILY = ("normmax", "normmax_vjp", "budget_sparsemax", "budget_sparsemax_vjp")


# the corpora are written once per session, shared by the pytest-xdist workers (conftest.py)
@pytest.fixture(scope="module")
def cheap_corpus(shared_tmp):
    return shared_tmp("cheap-corpus", lambda d: C.generate_corpus(d, seed=3, ops=CHEAP))


@pytest.fixture(scope="session")
def small_corpus(shared_tmp):
    return shared_tmp("small-corpus", lambda d: C.generate_corpus(d, seed=0, size="small"))


def _bytes(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _lines(path: Path) -> list:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


# a small entmax.jsonl (a few rows of each hard kind at every alpha, 50-digit checked) for the readers
MINI_KINDS = ("random", "ties", "masks", "all-masked", "tiny", "near-ties", "huge-offset", "found-by-hypothesis")


def _write_mini_entmax(d: Path) -> None:
    from entmax_ref.testing.conformance import exact, gen_rows, operations, sources, write

    rows, per_kind = [], {}
    for r in sources.row_sources("small", 0):
        if r.kind in MINI_KINDS and len(r.x) <= 64 and per_kind.get(r.kind, 0) < 2:
            per_kind[r.kind] = per_kind.get(r.kind, 0) + 1
            rows.append(r)
    ctx = sources.Context("small", 0, exact.RowOracle(), rows)
    gen_rows.prefill_refs(ctx)
    write._write_file(d, operations.operation("entmax"), gen_rows.gen_entmax(ctx), "entmax-ref test")
    (d / "manifest.json").write_text(json.dumps({"format_major": C.FORMAT_MAJOR}))
    for rel, text in W.runner_texts().items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)


@pytest.fixture(scope="module")
def mini_entmax(shared_tmp):
    return shared_tmp("mini-entmax", _write_mini_entmax)


# ----------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_numbers_are_shortest_round_trip_strings(dtype):
    rng = np.random.default_rng(0)
    vals = np.concatenate([rng.standard_normal(200) * 10.0 ** rng.integers(-40, 30, 200),
                           [0.1, 1e-45 if dtype == "float32" else 5e-324, 3.4e38, -0.0]]).astype(dtype)
    strs = C.nums(vals, dtype)
    assert np.array_equal(C.parse(strs, dtype), vals)
    assert C.num(0.1, dtype) == "0.1" and C.num(1.0, dtype) == "1.0"
    assert [C.num(v) for v in (-np.inf, np.inf, np.nan)] == ["-inf", "inf", "nan"]
    if dtype == "float32":  # float32's shortest string, not float64's 0.10000000149011612
        assert C.num(np.float32(0.1), dtype) == "0.1"


# ----------------------------------------------------------------------------- files


def test_manifest_and_checksums(cheap_corpus):
    m = json.loads((cheap_corpus / "manifest.json").read_text())
    assert m["format_major"] == C.FORMAT_MAJOR == 2 and m["generator"] == f"entmax-ref {er.__version__}"
    assert (m["seed"], m["size"]) == (3, "small")
    assert [f["file"] for f in m["files"]] == ["asentmax_scale.jsonl", "attention.jsonl", "attention_vjp.jsonl"]
    import hashlib

    for f in m["files"]:
        data = (cheap_corpus / f["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"]
        assert data.count(b"\n") == f["cases"]
    for rel, digest in {**m["schemas"], **m["runners"]}.items():
        assert hashlib.sha256((cheap_corpus / rel).read_bytes()).hexdigest() == digest
    assert set(m["schemas"]) == {f"schema/{k}.schema.json" for k in (*C.OPS, "manifest")} - {
        "schema/threshold.schema.json", "schema/normmax_threshold.schema.json"}
    assert set(m["runners"]) == {"runners/entmax_corpus.h", "runners/check_entmax.c", "runners/check_corpus.js"}
    assert set(m["notes"]["flags"]) == set(L.FLAGS) and m["tolerance_classes"] == L.TOLERANCE_CLASSES
    assert m["attention_cases"] >= 200  # >= 100 per attention file


def test_attention_cases_cover_the_features(cheap_corpus):
    cases = [json.loads(ln) for ln in (cheap_corpus / "attention.jsonl").read_text().splitlines()]
    assert {c["alpha"] for c in cases} == {"1.0", "1.5", "2.0", "3.0"}
    assert {c["dtype"] for c in cases} == {"float64", "float32"}
    assert any(c["causal"] and c["shape"]["Nq"] > c["shape"]["Nk"] for c in cases)
    assert any(c["shape"]["Hq"] > c["shape"]["Hkv"] for c in cases)
    assert any(c["alibi_slopes"] for c in cases) and any(c["beta"] for c in cases)
    assert any(c["key_lengths"] and 0 in c["key_lengths"] for c in cases)
    c = cases[0]
    q = C.parse(c["q"], c["dtype"])
    assert q.shape == (c["shape"]["B"], c["shape"]["Hq"], c["shape"]["Nq"], c["shape"]["D"])
    assert all(c["why"] for c in cases)


def test_same_seed_gives_identical_bytes_other_seed_differs(cheap_corpus, tmp_path):
    C.generate_corpus(tmp_path / "again", seed=3, ops=CHEAP)
    assert _bytes(tmp_path / "again") == _bytes(cheap_corpus)  # files, manifest
    for sub in ("schema", "runners"):
        assert _bytes(tmp_path / "again" / sub) == _bytes(cheap_corpus / sub)
    C.generate_corpus(tmp_path / "other", seed=4, ops=("asentmax_scale",))
    other = (tmp_path / "other" / "asentmax_scale.jsonl").read_bytes()
    assert other != (cheap_corpus / "asentmax_scale.jsonl").read_bytes()
    # a tcId is a digest of the inputs: the cases the two seeds share have the same ids
    ids = {json.dumps([c[k] for k in F.inputs("asentmax_scale")]): c["tcId"] for c in _lines(cheap_corpus / "asentmax_scale.jsonl")}
    shared = [c for c in _lines(tmp_path / "other" / "asentmax_scale.jsonl")
              if json.dumps([c[k] for k in F.inputs("asentmax_scale")]) in ids]
    assert shared and all(ids[json.dumps([c[k] for k in F.inputs("asentmax_scale")])] == c["tcId"] for c in shared)


# ----------------------------------------------------------------------------- loading


def test_load_corpus_rejects_edits_versions_and_missing_files(cheap_corpus, tmp_path):
    corpus = load_corpus(cheap_corpus)
    assert len(corpus) == sum(f["cases"] for f in corpus.manifest["files"])
    d = tmp_path / "c"
    shutil.copytree(cheap_corpus, d)
    with pytest.raises(CorpusError, match="no manifest.json"):
        load_corpus(tmp_path)
    path = d / "attention.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"1.5"', b'"1.6"', 1))
    with pytest.raises(CorpusError, match="SHA-256"):
        load_corpus(d)
    shutil.copy(cheap_corpus / "attention.jsonl", path)
    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**m, "format_major": 99}))
    with pytest.raises(CorpusError, match="corpus format 99; this entmax-ref reads formats 1, 2"):
        load_corpus(d)
    (d / "manifest.json").write_text(json.dumps(m))
    (d / "asentmax_scale.jsonl").unlink()
    with pytest.raises(CorpusError, match="missing"):
        load_corpus(d)


# ----------------------------------------------------------------------------- replay


def test_replay_cheap_files_on_numpy_and_a_wrong_implementation_fails(cheap_corpus):
    corpus = load_corpus(cheap_corpus)
    rep = C.replay_backend(corpus, "numpy", ops=CHEAP)
    assert rep.ok, rep.table()
    assert {r.op for r in rep.rows} == {"corpus asentmax_scale", "corpus attention", "corpus attention_vjp"}

    def sloppy(q, k, v, *, alpha=1.5, causal=False, key_lengths=None, alibi_slopes=None, beta=None, gamma=None):
        out = er.attention(q, k, v, alpha=alpha, causal=causal, key_lengths=key_lengths,
                           alibi_slopes=alibi_slopes, beta=beta, gamma=gamma, backend="numpy")
        return out * (1 + 1e-6)

    bad = replay_corpus(corpus, sloppy, "attention")
    assert not bad.ok and any("out of tolerance" in n for r in bad.rows for n in r.notes)
    with pytest.raises(ValueError, match="unknown corpus operation"):
        replay_corpus(corpus, sloppy, "normmaxx")


def test_check_command_replays_a_corpus(cheap_corpus, tmp_path, monkeypatch, capsys):
    (tmp_path / "user_attn.py").write_text(
        "import entmax_ref as er\n"
        "def attn(q, k, v, **kw):\n    return er.attention(q, k, v, backend='numpy', **kw)\n"
        "def scale(n, beta, gamma, delta, offset):\n    return er.asentmax_scale(n, beta, gamma, delta, offset) + 1e-9\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check_main(["--corpus", str(cheap_corpus), "--impl", "user_attn:attn", "--op", "attention"]) == 0
    assert "corpus attention" in capsys.readouterr().out
    assert check_main(["--corpus", str(cheap_corpus), "--impl", "user_attn:scale", "--op", "asentmax_scale"]) == 1
    assert check_main(["--corpus", str(tmp_path), "--backends", "numpy"]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    assert check_main(["--op", "entmax_loss", "--impl", "user_attn:attn"]) == 2


def test_corpus_command_usage_errors(tmp_path, capsys):
    assert cli_main(["corpus", "--out", str(tmp_path), "--size", "huge"]) == 2
    assert cli_main(["corpus", "--out", str(tmp_path), "--ops", "bogus"]) == 2
    assert "unknown corpus operation" in capsys.readouterr().err
    assert cli_main(["corpus", "--out", str(tmp_path), "--ops", "asentmax_scale", "--seed", "5"]) == 0
    assert json.loads((tmp_path / "manifest.json").read_text())["seed"] == 5


def test_missing_mpmath_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mpmath", None)
    with pytest.raises(ModuleNotFoundError, match=re.escape('pip install "entmax-ref[corpus]"')):
        C.generate_corpus(tmp_path, ops=("attention",))


# ----------------------------------------------------------------------------- normmax, budget-sparsemax


@pytest.fixture(scope="module")
def budget_corpus(shared_tmp):
    return shared_tmp("budget-corpus",
                      lambda d: C.generate_corpus(d, seed=0, ops=("budget_sparsemax", "budget_sparsemax_vjp")))


def test_budget_files_cover_the_hard_budgets_and_replay(budget_corpus, tmp_path, monkeypatch, capsys):
    corpus = load_corpus(budget_corpus)
    m = corpus.manifest
    assert [f["file"] for f in m["files"]] == ["budget_sparsemax.jsonl", "budget_sparsemax_vjp.jsonl"]
    assert all(f["beyond_oracle_tol"] == 0 and f["cases"] >= 250 for f in m["files"])
    cases = corpus.cases["budget_sparsemax.jsonl"]
    live = [int(np.isfinite(C.parse(c["x"])).sum()) for c in cases]
    assert {"0.0", "1.0", "2.0", "0.3", "2.5"} <= {c["budget"] for c in cases}
    assert any(float(c["budget"]) == c["n"] for c in cases)  # every entry 1
    assert any(float(c["budget"]) > k > 0 for c, k in zip(cases, live))  # fewer unmasked entries than the budget
    assert {"support-boundary", "ties", "masks", "all-masked", "huge-offset"} <= {c["kind"] for c in cases}
    for c in cases:  # p sums to the budget (capped by the unmasked entries), within its tolerances
        p, tol = C.parse(c["p"]), C.parse(c["tol_p"])
        assert abs(p.sum() - min(float(c["budget"]), np.isfinite(C.parse(c["x"])).sum())) <= tol.sum() + 1e-300
    assert any(c["ill_posed"] for c in corpus.cases["budget_sparsemax_vjp.jsonl"])
    rep = C.replay_backend(corpus, "numpy", ops=("budget_sparsemax", "budget_sparsemax_vjp"))
    assert rep.ok and {r.op for r in rep.rows} == {"corpus budget_sparsemax", "corpus budget_sparsemax_vjp"}

    def off_by_one_ulp(x, budget):
        p = er.budget_sparsemax(x, budget, backend="numpy")
        return np.where((p > 0) & (p < 1), p + 1e-12, p)

    bad = replay_corpus(corpus, off_by_one_ulp, "budget_sparsemax")
    assert not bad.ok and any("out of tolerance" in n for r in bad.rows for n in r.notes)
    (tmp_path / "user_budget.py").write_text(
        "import entmax_ref as er\n"
        "def proj(x, b):\n    return er.budget_sparsemax(x, b, backend='numpy')\n"
        "def vjp(x, g, budget):\n    p = er.budget_sparsemax(x, budget, backend='numpy')\n"
        "    return er.budget_sparsemax_vjp(p, g, budget, backend='numpy')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check_main(["--corpus", str(budget_corpus), "--impl", "user_budget:proj", "--op", "budget_sparsemax"]) == 0
    assert check_main(["--corpus", str(budget_corpus), "--impl", "user_budget:vjp", "--op",
                       "budget_sparsemax_vjp"]) == 0
    assert "corpus budget_sparsemax_vjp" in capsys.readouterr().out
    import importlib

    rep = replay_corpus(corpus, importlib.import_module("user_budget").vjp, "budget_sparsemax_vjp")
    assert rep.ok and any("ill-posed case(s) not compared" in n for r in rep.rows for n in r.notes)
    assert check_main(["--corpus", str(budget_corpus), "--impl", "user_budget:proj", "--op", "normmax"]) == 0
    assert "no normmax.jsonl" in capsys.readouterr().out


def test_shared_budgets_live_in_the_tolerance_model():
    from entmax_ref.testing import command, tolerance as T

    src = "".join(f.read_text() for f in sorted((ROOT / "entmax_ref" / "testing" / "conformance").glob("*.py")))
    assert "def _loss_tolerance" not in src and "def _alpha_vjp_tolerance" not in src
    assert "def _scale_tolerances" not in src and "T.loss_tolerance" in src
    import inspect

    assert "T.loss_tolerance(" in inspect.getsource(command._check_loss)
    x = np.array([[0.5, -1.0, -np.inf, 2.0]])
    p = er.entmax(x, 1.5, backend="numpy")
    q = np.eye(4)[[1]]
    L = er.entmax_loss(x, np.array([1]), 1.5, backend="numpy")
    # delta_n (1 + |L| + max |x_i - max x| over the support of p and the target: 3 here)
    assert T.loss_tolerance(x, p, q, L, "float64")[0] == T.threshold_budget("float64", 4) * (1 + abs(L[0]) + 3.0)
    s, db, dg = T.asentmax_scale_tolerances(0, 1.0, 1.0, 0.0, float(np.e) - 1.0, 1.0, 0.0)
    assert 0 < s < 1e-14 and 0 < db < 1e-14 and 0 < dg < 1e-14


# ----------------------------------------------------------------------------- the small corpus


@pytest.mark.slow
def test_small_corpus_sizes_and_hard_cases(small_corpus):
    corpus = load_corpus(small_corpus)
    m = corpus.manifest
    counts = {f["file"]: f["cases"] for f in m["files"]}
    assert counts["entmax.jsonl"] >= 1000 and m["row_cases"] >= 1000
    assert counts["attention.jsonl"] >= 100 and counts["attention_vjp.jsonl"] >= 100
    assert all(f["beyond_oracle_tol"] == 0 for f in m["files"])
    assert {f"{op}.jsonl" for op in FAMILY} <= set(counts) and all(counts[f"{op}.jsonl"] >= 250 for op in FAMILY)
    nm = corpus.cases["normmax.jsonl"]
    assert {"1.001", "1.05", "2.0", "50.0"} <= {c["alpha"] for c in nm}
    assert {"support-boundary", "near-ties", "huge-offset", "masks", "all-masked"} <= {c["kind"] for c in nm}
    assert all(c["tau"] == "-inf" and set(c["p"]) == {"0.0"} for c in nm if c["kind"] == "all-masked")
    assert any(c["ill_posed"] for c in corpus.cases["normmax_vjp.jsonl"])
    rows = corpus.cases["entmax.jsonl"]
    kinds = {c["kind"] for c in rows}
    assert {"near-ties", "support-boundary", "huge-offset", "masks", "all-masked", "long",
            "found-by-hypothesis", "alpha-far-above-2"} <= kinds
    alphas = {float(c["alpha"]) for c in rows}
    assert {1.0, 1.000001, 2.0, 100.0, 1000.0} <= alphas
    assert all(c["reaches_oracle"] for c in rows if float(c["alpha"]) <= 2.0)
    assert all(float(c["oracle_err"]) <= ORACLE_ATOL for c in rows if float(c["alpha"]) <= 2.0)
    masked = [c for c in rows if c["kind"] == "all-masked"]
    assert masked and all(c["tau"] == "-inf" and c["support"] == 0 and set(c["p"]) == {"0.0"} for c in masked)
    for c in rows[:50]:  # inputs round-trip in their dtype, p sums to 1 on live rows
        x = C.parse(c["x"], c["dtype"])
        assert C.nums(x, c["dtype"]) == c["x"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["numpy", pytest.param("numba", marks=pytest.mark.numba)])
def test_small_corpus_replays_without_failures(small_corpus, name):
    if er.backends.unavailable_reason(name):
        pytest.skip(er.backends.unavailable_reason(name))
    rep = C.replay_backend(small_corpus, name)
    assert rep.ok, rep.table()
    assert len(rep.rows) >= 13
    assert {f"corpus {op}" for op in FAMILY + ("normmax_threshold",)} <= {r.op for r in rep.rows}


# ----------------------------------------------------------------------------- the format: hex, schema, ids


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
    # a float32 value in the digits C's printf("%a", (double)f) gives: exact in either dtype
    assert L.hexnum(np.float32(0.1)) == "0x1.99999ap-4" and L.hexnum(np.float32(1e-45)) == "0x1p-149"


def _check_lines(folder: Path, limit: int | None = None) -> int:
    """Every line (the first ``limit`` of each file) conforms to its schema; every number's hex and decimal forms are the same
    value (the decimal read in the case's dtype for inputs, float64 otherwise); tcIds are
    unique and are the digest of the inputs; flags name known flags; groups are contiguous."""
    assert validate_corpus(folder, limit) > 1
    m = json.loads((folder / "manifest.json").read_text())
    count = 0
    for f in m["files"]:
        op, seen = f["op"], set()
        cases = _lines(folder / f["file"])
        for c in cases:
            for fld in F.numeric(op):
                if c[fld.name] is None:
                    assert c[fld.name + "_hex"] is None
                    continue
                dt = c["dtype"] if fld.role == "in" else "float64"
                # the hex form is the value itself (read as float64 it is already of the dtype)
                dec, hexed = C.parse(c[fld.name], dt).astype(np.float64), L.value(c, fld.name, "float64")
                assert dec.tobytes() == hexed.tobytes(), (c["tcId"], fld.name)
                count += dec.size
            assert c["tcId"] not in seen and c["tcId"] == L.tcid(op, c)
            seen.add(c["tcId"])
            assert set(c["tol"]) == set(F.outputs(op)) and set(c["flags"]) <= set(L.FLAGS)
        for g in f["groups"]:
            group = cases[g["first"] - 1:g["first"] - 1 + g["cases"]]
            assert all(c["dtype"] == g["dtype"] and c.get(g["param"]) == g["value"] for c in group if g["param"])
        assert sum(g["cases"] for g in f["groups"]) == len(cases)
    return count


def test_every_line_validates_and_hex_agrees_with_decimal(cheap_corpus):
    # jsonschema takes 0.1 s per attention line: the schema check here covers the first 15 lines
    # of each file (CI and the small-corpus test validate every line); the hex check covers all
    assert _check_lines(cheap_corpus, limit=15) > 100_000
    cases = _lines(cheap_corpus / "attention.jsonl")
    assert {"causal", "grouped-query", "cross", "key-padding", "empty-query-rows", "alibi", "asentmax"} <= {
        f for c in cases for f in c["flags"]}
    assert {c["tol"]["out"] for c in cases} == {"abs:@tol_out"}
    assert {c["tol"]["ddelta"] for c in _lines(cheap_corpus / "asentmax_scale.jsonl")} == {"exact"}


def test_schema_rejects_a_bad_line_naming_it(cheap_corpus, tmp_path):
    d = tmp_path / "c"
    shutil.copytree(cheap_corpus, d)
    path = d / "attention.jsonl"
    lines = path.read_text().splitlines()
    c = json.loads(lines[4])
    c["scale_hex"] = "0x1.8"  # no exponent: not a C99 hex float
    lines[4] = json.dumps(c)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=r"attention.jsonl:5: scale_hex: '0x1.8' does not match"):
        validate_corpus(d)
    del c["scale_hex"], c["tcId"]
    lines[4] = json.dumps(c)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=r"attention.jsonl:5: .*is a required property"):
        validate_corpus(d)
    assert validate_main([str(d)]) == 1 and validate_corpus(cheap_corpus, limit=10) == 31


def test_tolerance_classes():
    case = {"dtype": "float32", "tol": {"p": "exact", "q": "ulps:2", "r": "abs:1e-3", "s": "abs:@tol_s",
                                        "u": "abs:0x1p-10", "w": "relative"},
            "tol_s": ["0.5", "0.25"], "tol_s_hex": ["0x1p-1", "0x1p-2"]}
    e = np.array([1.0, 3.0])
    assert np.array_equal(L.tolerance(case, "p", e, "float32"), [0.0, 0.0])
    assert np.array_equal(L.tolerance(case, "q", e, "float32"), [2 * 2.0 ** -23, 2 * 2.0 ** -22])
    assert np.array_equal(L.tolerance(case, "q", e, "float64"), [2 * 2.0 ** -52, 2 * 2.0 ** -51])
    assert np.array_equal(L.tolerance(case, "r", e, "float32"), [1e-3, 1e-3])
    assert np.array_equal(L.tolerance(case, "s", e, "float32"), [0.5, 0.25])
    assert np.array_equal(L.tolerance(case, "u", e, "float32"), [2.0 ** -10] * 2)
    with pytest.raises(ValueError, match="unknown tolerance class 'relative' for w"):
        L.tolerance(case, "w", e, "float32")
    # format 1 (no tol object): the tol_ field, read from its decimal form
    assert np.array_equal(L.tolerance({"tol_s": ["0.5", "0.25"]}, "s", e, "float64"), [0.5, 0.25])


def _as_format_1(src: Path, dst: Path) -> None:
    """A format 1 corpus of the same cases: decimal numbers only, no schema, ids, flags or classes."""
    m = json.loads((src / "manifest.json").read_text())
    dst.mkdir()
    files = []
    for f in m["files"]:
        out = []
        for i, c in enumerate(_lines(src / f["file"]), 1):
            c = {k: v for k, v in c.items() if not k.endswith("_hex") and k not in ("schema", "tcId", "flags", "tol")}
            out.append(json.dumps({"id": f"{f['op']}-{i:05d}", **c}, separators=(",", ":")) + "\n")
        data = "".join(out).encode()
        (dst / f["file"]).write_bytes(data)
        import hashlib

        files.append({"file": f["file"], "op": f["op"], "cases": len(out), "sha256": hashlib.sha256(data).hexdigest()})
    (dst / "manifest.json").write_text(json.dumps({"format": m["format"], "schema_version": 1, "files": files}))


def test_a_format_1_corpus_still_replays(cheap_corpus, tmp_path):
    _as_format_1(cheap_corpus, tmp_path / "v1")
    corpus = load_corpus(tmp_path / "v1")
    assert corpus.format == 1 and load_corpus(cheap_corpus).format == 2
    rep = C.replay_backend(corpus, "numpy", ops=("asentmax_scale", "attention"))
    assert rep.ok and len(rep.rows) == 3, rep.table()


# ----------------------------------------------------------------------------- the readers in C and JavaScript

RUNNERS = Path(C.__file__).parent / "runners"


def _compile(src: Path, out: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    res = subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-O2", "-o", str(out), str(src),
                          "-lm"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return out


def _run_reader(cmd, corpus: Path):
    res = subprocess.run([*map(str, cmd), str(corpus)], capture_output=True, text=True, timeout=120)
    summary = res.stdout.strip().splitlines()[-1]
    return res.returncode, res.stdout, summary


def test_c_reader_passes_a_correct_entmax_and_fails_an_off_by_one_support(mini_entmax, tmp_path):
    src = mini_entmax / "runners" / "check_entmax.c"
    assert src.read_text() == (RUNNERS / "check_entmax.c").read_text()
    rc, out, summary = _run_reader([_compile(src, tmp_path / "ok")], mini_entmax)
    passed = int(re.match(r"(\d+) passed, 0 failed, (\d+) skipped", summary).group(1))
    assert rc == 0 and passed >= 100 and out.count("PASS entmax-") == passed, summary
    assert {"0x1p+0", "0x1.8p+0", "0x1p+1"} <= {c["alpha_hex"] for c in _lines(mini_entmax / "entmax.jsonl")}
    text = src.read_text()
    good = "1.0 + (k + 1) * work[k] > cum"  # the sparsemax support test
    assert text.count(good) == 1
    wrong = tmp_path / "wrong" / "check_entmax.c"
    wrong.parent.mkdir()
    shutil.copy(mini_entmax / "runners" / "entmax_corpus.h", wrong.parent)
    wrong.write_text(text.replace(good, "1.0 + k * work[k] > cum"))
    rc, out, summary = _run_reader([_compile(wrong, tmp_path / "bad")], mini_entmax)
    assert rc == 1 and int(re.search(r"(\d+) failed", summary).group(1)) > 5 and "FAIL entmax-" in out


def test_c_reader_parses_json_escapes_and_rejects_an_old_corpus(mini_entmax, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    c = _lines(mini_entmax / "entmax.jsonl")[0]
    c["why"] = "tab\t quote\" slash\\ snowman \u2603 clef \U0001d11e"
    (d / "entmax.jsonl").write_text(json.dumps(c) + "\n")  # ensure_ascii: \u escapes and a surrogate pair
    exe = _compile(mini_entmax / "runners" / "check_entmax.c", tmp_path / "ok")
    rc, out, summary = _run_reader([exe], d)
    assert rc == 0 and summary.startswith("1 passed"), out
    del c["schema"]
    (d / "entmax.jsonl").write_text(json.dumps(c) + "\n")
    res = subprocess.run([str(exe), str(d)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "not a format 2 corpus" in res.stderr


def test_javascript_reader_passes_softmax_and_sparsemax_and_fails_a_wrong_one(mini_entmax, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    js = mini_entmax / "runners" / "check_corpus.js"
    rc, out, summary = _run_reader([node, js], mini_entmax)
    passed = int(re.match(r"(\d+) passed, 0 failed", summary).group(1))
    assert rc == 0 and passed >= 40 and out.count("PASS entmax-") == passed, out[-2000:]
    text = js.read_text()
    good = "if (1 + (k + 1) * v > cum)"
    assert text.count(good) == 1
    (tmp_path / "wrong.js").write_text(text.replace(good, "if (1 + k * v > cum)"))
    rc, out, summary = _run_reader([node, tmp_path / "wrong.js"], mini_entmax)
    assert rc == 1 and int(re.search(r"(\d+) failed", summary).group(1)) > 5


@pytest.mark.slow
def test_small_corpus_lines_validate_hex_agrees_and_readers_pass(small_corpus, tmp_path):
    assert _check_lines(small_corpus) > 100_000
    rows = _lines(small_corpus / "entmax.jsonl")
    flags = {f for c in rows for f in c["flags"]}
    assert set(L.FLAGS) - flags == {"ill-posed", "budget-zero", "budget-above-support", "causal", "grouped-query",
                                    "cross", "key-padding", "empty-query-rows", "alibi", "asentmax"}
    rc, out, summary = _run_reader([_compile(small_corpus / "runners" / "check_entmax.c", tmp_path / "ok")], small_corpus)
    assert rc == 0, summary
    node = shutil.which("node")
    if node is not None:
        rc, out, summary = _run_reader([node, small_corpus / "runners" / "check_corpus.js"], small_corpus)
        assert rc == 0 and int(summary.split()[0]) >= 300, summary
