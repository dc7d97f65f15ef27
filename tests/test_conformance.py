"""The conformance corpus (``entmax-ref corpus``): files, determinism, loading, replay, reader.

The fast tests write only the cheap files (the ASEntmax scale and the attention cases);
the ``slow`` ones write the whole small corpus once (the 50-digit oracle checks every row
case, about a minute) and replay it on numpy and numba.
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
from entmax_ref.cli import main as cli_main
from entmax_ref.testing import CorpusError, load_corpus, replay_corpus
from entmax_ref.testing import conformance as C
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
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


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
    assert m["schema_version"] == C.SCHEMA_VERSION and m["entmax_ref_version"] == er.__version__
    assert (m["seed"], m["size"]) == (3, "small")
    assert [f["file"] for f in m["files"]] == ["asentmax_scale.jsonl", "attention.jsonl", "attention_vjp.jsonl"]
    import hashlib

    for f in m["files"]:
        data = (cheap_corpus / f["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"]
        assert data.count(b"\n") == f["cases"]
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
    C.generate_corpus(tmp_path / "again", seed=3, ops=("asentmax_scale", "attention"))
    for f in ("asentmax_scale.jsonl", "attention.jsonl"):
        assert (tmp_path / "again" / f).read_bytes() == (cheap_corpus / f).read_bytes()
    C.generate_corpus(tmp_path / "other", seed=4, ops=("asentmax_scale",))
    assert (tmp_path / "other" / "asentmax_scale.jsonl").read_bytes() != (cheap_corpus / "asentmax_scale.jsonl").read_bytes()


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
    (d / "manifest.json").write_text(json.dumps({**m, "schema_version": 99}))
    with pytest.raises(CorpusError, match="schema version 99"):
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
    assert all(float(c["oracle_err"]) <= 4e-15 for c in rows if float(c["alpha"]) <= 2.0)
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


@pytest.mark.slow
def test_javascript_reader_in_the_docs(small_corpus, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    text = (ROOT / "docs" / "corpus.md").read_text()
    code = re.search(r"```javascript\n(.*?)```", text, flags=re.S).group(1)
    assert len(code.splitlines()) <= 40
    (tmp_path / "check_corpus.js").write_text(code)
    res = subprocess.run([node, str(tmp_path / "check_corpus.js"), str(small_corpus)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    checked = int(re.search(r"(\d+) cases checked, 0 failed", res.stdout).group(1))
    assert checked >= 300
