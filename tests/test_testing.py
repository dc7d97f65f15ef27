"""entmax_ref.testing: tolerances, assertions, batteries, adapters and strategies.

The batteries must pass correct implementations and catch deliberately wrong ones: a
shifted threshold, a renormalised unconverged bisection, a wrong Jacobian and an
off-by-one causal mask.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings

import entmax_ref as er
from entmax_ref.backends._base import tau_to_theta
from entmax_ref.testing import (
    assert_attention_close,
    assert_attention_grads_close,
    assert_entmax_close,
    assert_entmax_vjp_close,
    assert_threshold_close,
    check_attention,
    check_entmax,
    check_entmax_vjp,
    check_threshold,
    from_numpy,
    to_numpy,
)
from entmax_ref.testing import tolerance as T
from entmax_ref.testing.report import LEGEND, CheckRow
from entmax_ref.testing.corpus import row_corpus
from entmax_ref.testing.strategies import alpha_columns, attention_problems

QUICK = dict(size="quick", seed=0)


# ----------------------------------------------------------------------------- wrong implementations


def shifted_threshold(x, alpha):
    """The exact threshold moved by 1e-6 (x-space): p no longer sums to 1."""
    x = np.asarray(x)
    _, info = er.entmax(x.astype(np.float64), alpha, return_info=True, backend="numpy")
    theta = tau_to_theta(info.tau, np.full(info.tau.shape, float(alpha))) + 1e-6
    return T.e_alpha(x - theta[..., None], alpha).astype(x.dtype)


def renormalised_bisection(x, alpha, n_iter=20):
    """entmax_bisect's recipe with too few halvings, hidden by dividing by the sum."""
    x = np.asarray(x, np.float64)
    x = x - x.max(axis=1, keepdims=True)  # shift by the max, as every stable solver does
    m = np.zeros((len(x), 1))
    lo, hi = m, m + 1.0 / (alpha - 1)  # mass >= 1 at theta = max, <= 1 at max + 1/(alpha-1)
    for _ in range(n_iter):
        mid = (lo + hi) / 2
        mass = T.e_alpha(x - mid, alpha).sum(axis=1, keepdims=True)
        lo, hi = np.where(mass > 1, mid, lo), np.where(mass > 1, hi, mid)
    p = T.e_alpha(x - (lo + hi) / 2, alpha)
    return p / p.sum(axis=1, keepdims=True)


def softmax_jacobian_vjp(p, g, alpha):
    """Uses u = p (the softmax Jacobian) whatever alpha is."""
    p, g = np.asarray(p, np.float64), np.asarray(g, np.float64)
    return p * (g - (p * g).sum(axis=1, keepdims=True))


def off_by_one_causal(q, k, v, *, alpha=1.5, causal=False, **kw):
    """Causal attention that lets query i also see key i_abs + 1."""
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    rep = Hq // k.shape[1]
    kk, vv = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    z = np.einsum("bhid,bhjd->bhij", q, kk) / np.sqrt(D)
    if causal:
        allowed = np.arange(Nk)[None, :] <= np.arange(Nq)[:, None] + Nk - Nq + 1
        z = np.where(allowed, z, -np.inf)
    return np.einsum("bhij,bhjd->bhid", er.entmax(z, alpha, backend="numpy"), vv)


def correct_attention(q, k, v, **kw):
    return er.attention(q, k, v, backend="numpy", **kw)


# ----------------------------------------------------------------------------- tolerance formula


def check_tolerance_pins(T) -> None:
    """Each formula of the tolerance model ``T`` (a module like
    :mod:`entmax_ref.testing.tolerance`) at values worked out by hand: exactly where the
    formula is exact in floating point, else to 2 float64 ulps."""
    u, u32 = 2.0**-53, 2.0**-24
    tiny = float(np.finfo(np.float64).tiny)

    def near(got, want):
        np.testing.assert_allclose(got, want, rtol=2 * np.finfo(np.float64).eps, atol=0)

    # the unit roundoffs and formula 1, delta_n = u (8 + 4 sqrt(n)): exact at n = 16 and n = 1
    assert (T.unit_roundoff(np.float64), T.unit_roundoff(np.float32)) == (u, u32)
    assert (T.unit_roundoff(np.float16), T.unit_roundoff("bfloat16")) == (2.0**-11, 2.0**-8)
    assert T.threshold_budget(np.float64, 16) == 24 * u and T.threshold_budget(np.float32, 16) == 24 * u32
    assert T.threshold_budget(np.float64, 1) == 12 * u == T.threshold_budget(np.float64, 0)
    delta2, delta3 = u * (8 + 4 * np.sqrt(2)), u * (8 + 4 * np.sqrt(3))
    near(T.threshold_budget(np.float64, 3), delta3)
    # formula 3, tol_tau = max(alpha - 1, 1[alpha = 1]) delta_n + 2u |tau|: exact at n = 16
    assert T.threshold_tolerance(0.5, 2.0, np.float64, 16) == 25 * u
    assert T.threshold_tolerance(-3.0, 1.0, np.float64, 16) == 30 * u
    assert T.threshold_tolerance(1.0, 1.5, np.float64, 16) == 14 * u
    assert T.threshold_tolerance(-np.inf, 1.5, np.float64, 16) == 0.0
    # formula 2 on sparsemax (1/4, 3/4, 0): t = p - 1 on the support and -1 at the zero, so
    # d = delta_3 + 2u (3/4, 1/4, 1); the envelope is d itself (p is linear in t), plus u p and tiny
    d = delta3 + 2 * u * np.array([0.75, 0.25, 1.0])
    near(T.entmax_tolerance(np.array([[0.25, 0.75, 0.0]]), 2.0, np.float64)[0],
         d + u * np.array([0.25, 0.75, 0.0]) + tiny)
    # softmax (1/4, 3/4): relative, p (e^d - 1) + u p + tiny with d = delta_2 + 2u |log p|
    p = np.array([0.25, 0.75])
    near(T.entmax_tolerance(p[None], 1.0, np.float64)[0], p * np.expm1(delta2 + 2 * u * np.abs(np.log(p))) + u * p + tiny)
    # alpha = 3: the zero at the threshold (t = -1/2) gets the Hölder term ((alpha-1) d)^(1/(alpha-1)); masked 0
    tol = T.entmax_tolerance(np.array([[1.0, 0.0, 0.0]]), 3.0, np.float64, masked=np.array([[False, False, True]]))
    near(tol[0, 1], np.sqrt(2 * (delta3 + 2 * u * 0.5)) + tiny)
    assert tol[0, 2] == 0.0
    # formula 4, tol_row = 4 delta_n kappa max|g| max u + 2u max|dx|, u = p^(2-alpha), kappa = 1 + max
    # |2-alpha| p^(1-alpha).  sparsemax (1/4, 3/4), g = (1, -1): u = 1, kappa = 1, dx = (1, -1)
    g = np.array([[1.0, -1.0]])
    near(T.vjp_tolerance(p[None], g, np.array([[1.0, -1.0]]), 2.0, np.float64)[0], 4 * delta2 + 2 * u)
    # 1.5-entmax (1/4, 3/4): u = (1/2, sqrt(3)/2), kappa = 1 + (1/2) (1/4)^(-1/2) = 2,
    # dx = u (g - (u . g) / sum u) = (1 - sqrt 3) / (1 + sqrt 3) (-1, 1) ... its max |dx|
    w = np.sqrt(p)
    dx = w * (g[0] - (w @ g[0]) / w.sum())
    near(T.vjp_tolerance(p[None], g, dx[None], 1.5, np.float64)[0],
         4 * delta2 * 2 * 1.0 * np.sqrt(0.75) + 2 * u * np.abs(dx).max())
    # formula 6, delta_n (1 + |L| + max |x_i - max x| over the support of p or the target)
    near(T.loss_tolerance(np.array([[2.0, 1.0, -4.0]]), np.array([[0.75, 0.25, 0.0]]), np.array([[1.0, 0, 0]]),
                          np.array([0.125]), np.float64), delta3 * (1 + 0.125 + 1.0))
    # the ill-posed rule: alpha >= 2 and an entry within ILL_POSED = 1000 delta_n of the threshold
    def flagged(k, alpha=2.0):
        x = np.array([[0.5, -1.0 / (alpha - 1) + k * delta3, -5.0]])
        return bool(T.ill_posed_rows(x, np.zeros(1), alpha, np.float64)[0])

    assert flagged(999) and not flagged(1001) and flagged(-999, 3.0) and not flagged(-1001, 3.0)
    assert not flagged(10, 1.9)


def test_tolerance_formula_values():
    check_tolerance_pins(T)


def test_the_ill_posed_rule_leaves_out_few_rows():
    """At most 1 row in 16 of the built-in corpus is left out of the VJP comparison as
    ill-posed (alpha >= 2 with an entry at the threshold): a wider rule would hide errors."""
    for dt in (np.float64, np.float32):
        for a in (2.0, 2.5, 3.0):
            rows = flagged = 0
            for case in row_corpus("default", 0):
                x = case.x.astype(dt).astype(np.float64)
                _, info = er.entmax(x, a, return_info=True, backend="numpy")
                flagged += int(T.ill_posed_rows(x, tau_to_theta(info.tau, np.full(len(x), a)), a, dt).sum())
                rows += len(x)
            assert flagged <= rows / 16, (np.dtype(dt).name, a, flagged, rows)


TOLERANCE_MUTANTS = {
    "C_THETA x10": ("C_THETA = 8.0", "C_THETA = 80.0"),
    "LAMBDA x10": ("LAMBDA = 4.0", "LAMBDA = 40.0"),
    "VJP tolerance x10": ("tol = 4 * d * vjp_kappa(p, a) * gmax", "tol = 40 * d * vjp_kappa(p, a) * gmax"),
    "threshold tolerance x10": ("tol = factor * (scale * threshold_budget", "tol = 10 * factor * (scale * threshold_budget"),
    "ill-posed cut-off 1e3 -> 1e5": ("ILL_POSED = 1e3", "ILL_POSED = 1e5"),
}


@pytest.mark.parametrize("name", TOLERANCE_MUTANTS)
def test_each_mutant_of_the_tolerance_model_is_caught(name):
    """The pins above fail on a copy of tolerance.py with one constant or factor changed."""
    import types
    from pathlib import Path

    old, new = TOLERANCE_MUTANTS[name]
    source = Path(T.__file__).read_text(encoding="utf-8")
    assert source.count(old) == 1, f"the mutated text is not once in tolerance.py: {old!r}"
    mutant = types.ModuleType("tolerance_mutant")
    exec(compile(source.replace(old, new), T.__file__, "exec"), mutant.__dict__)
    with pytest.raises(AssertionError):
        check_tolerance_pins(mutant)


def test_tolerance_grows_with_n_and_shrinks_with_precision():
    assert T.threshold_budget(np.float64, 10_000) > T.threshold_budget(np.float64, 10)
    assert T.threshold_budget(np.float16, 10) > T.threshold_budget(np.float32, 10)


# ----------------------------------------------------------------------------- assertions


def test_assertions_accept_exact_answers_and_report_misses():
    x = np.array([[-2.0, 0.0, 0.5], [1.0, 1.0, -np.inf]])
    assert_entmax_close(er.sparsemax(x), x, alpha=2)
    assert_threshold_close(er.entmax_threshold(x, 2), x, alpha=2)
    with pytest.raises(AssertionError) as exc:
        assert_entmax_close(np.array([[0.0, 0.25, 0.75], [0.5, 0.5, 1e-12]]), x, alpha=2)
    msg = str(exc.value)
    for part in ("worst at index (1, 2)", "row 1", "expected 0.0", "got 1e-12", "support differs in 1",
                 "import numpy as np, entmax_ref as er", "np.inf"):
        assert part in msg, part


def test_assertion_follows_axis_and_per_row_alpha():
    x = np.random.default_rng(0).standard_normal((5, 4))
    alpha = np.array([1.0, 1.5, 2.0, 3.0])
    assert_entmax_close(er.entmax(x, alpha, axis=0), x, alpha=alpha, axis=0)
    with pytest.raises(AssertionError):
        assert_entmax_close(er.entmax(x, 1.5, axis=0), x, alpha=alpha, axis=0)


@pytest.mark.parametrize("shape", [(8,), (4, 2), (2, 1, 4)])
def test_assertions_refuse_a_result_of_another_shape_with_as_many_entries(shape):
    x = np.random.default_rng(3).standard_normal((2, 4))
    g = np.random.default_rng(4).standard_normal((2, 4))
    p = er.entmax(x, 1.5)
    with pytest.raises(AssertionError, match=rf"actual has shape \({shape[0]},"):
        assert_entmax_close(p.reshape(shape), x, alpha=1.5)
    with pytest.raises(AssertionError, match="actual_dx has shape"):
        assert_entmax_vjp_close(er.entmax_vjp(p, g, 1.5).reshape(shape), x, g, alpha=1.5)
    with pytest.raises(AssertionError, match=r"actual_tau has shape \(2, 1\), expected \(2,\)"):
        assert_threshold_close(er.entmax_threshold(x, 1.5).reshape(2, 1), x, alpha=1.5)
    # the same entries in the right shape pass, along another axis and for a 0-d input too
    assert_entmax_close(er.entmax(x, 1.5, axis=0), x, alpha=1.5, axis=0)
    with pytest.raises(AssertionError, match=r"actual has shape \(4, 2\), expected \(2, 4\)"):
        assert_entmax_close(er.entmax(x, 1.5, axis=0).T, x, alpha=1.5, axis=0)
    assert_entmax_close(er.entmax(np.float64(3.0), 1.5), np.float64(3.0), alpha=1.5)
    assert_threshold_close(er.entmax_threshold(np.float64(3.0), 1.5), np.float64(3.0), alpha=1.5)


def test_float32_results_are_judged_by_float32_budgets():
    x = np.random.default_rng(1).standard_normal((6, 40)).astype(np.float32)
    p32 = er.entmax(x, 1.5)
    assert_entmax_close(p32, x, alpha=1.5)
    # the same numbers claimed as float64 are far outside the float64 budget
    with pytest.raises(AssertionError):
        assert_entmax_close(p32, x, alpha=1.5, dtype=np.float64)


def test_vjp_and_attention_assertions():
    rng = np.random.default_rng(2)
    x, g = rng.standard_normal((4, 9)), rng.standard_normal((4, 9))
    assert_entmax_vjp_close(er.entmax_vjp(er.entmax(x, 1.5), g, 1.5), x, g, alpha=1.5)
    with pytest.raises(AssertionError, match="dx"):
        assert_entmax_vjp_close(softmax_jacobian_vjp(er.entmax(x, 1.5), g, 1.5), x, g, alpha=1.5)
    q, k, v = rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 1, 6, 4)), rng.standard_normal((1, 1, 6, 3))
    kw = dict(alpha=1.5, causal=True)
    assert_attention_close(er.attention(q, k, v, **kw), q, k, v, **kw)
    do = rng.standard_normal((1, 2, 5, 3))
    assert_attention_grads_close(er.attention_vjp(do, q, k, v, **kw)[:3], do, q, k, v, **kw)
    with pytest.raises(AssertionError, match="attention output"):
        assert_attention_close(off_by_one_causal(q, k, v, **kw), q, k, v, **kw)


# ----------------------------------------------------------------------------- batteries


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 3.0])
def test_reference_passes_its_own_battery(alpha):
    rep = check_entmax(lambda x, alpha: er.entmax(x, alpha, backend="numpy"), alpha, **QUICK)
    assert rep.ok, rep.table()
    assert all(r.props_passed == r.props_total > 0 for r in rep.rows)


def test_shifted_threshold_is_caught():
    rep = check_entmax(shifted_threshold, 1.5, dtypes=("float64",), **QUICK)
    assert not rep.ok
    assert "out of tolerance" in rep.rows[0].notes[0]


@pytest.mark.parametrize("alpha", [1.25, 2.0])
def test_renormalised_unconverged_bisection_is_caught(alpha):
    p = renormalised_bisection(np.random.default_rng(0).standard_normal((4, 30)), alpha)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)  # it looks fine: it sums to 1
    rep = check_entmax(lambda x, alpha: renormalised_bisection(x, alpha), alpha, dtypes=("float64",),
                       masked_rows=False, **QUICK)
    assert not rep.ok


def test_well_converged_bisection_passes():
    rep = check_entmax(lambda x, alpha: renormalised_bisection(x, alpha, n_iter=200), 1.25, dtypes=("float64",),
                       masked_rows=False, **QUICK)
    assert rep.ok, rep.table()


def test_wrong_jacobian_is_caught_and_right_one_passes():
    good = check_entmax_vjp(lambda p, g, alpha: er.entmax_vjp(p, g, alpha, backend="numpy"), 1.5, inputs="p", **QUICK)
    assert good.ok, good.table()
    assert not any("finite differences" in note for row in good.rows for note in row.notes), good.table()
    bad = check_entmax_vjp(softmax_jacobian_vjp, 1.5, inputs="p", dtypes=("float64",), **QUICK)
    assert not bad.ok


def test_threshold_battery():
    assert check_threshold(lambda x, alpha: er.entmax_threshold(x, alpha), 2.0, **QUICK).ok
    off = check_threshold(lambda x, alpha: er.entmax_threshold(x, alpha) + 1e-9, 2.0, dtypes=("float64",), **QUICK)
    assert not off.ok


def test_off_by_one_causal_mask_is_caught():
    kw = dict(features=("causal",), dtypes=("float64",), **QUICK)
    assert check_attention(correct_attention, 1.5, **kw).ok
    rep = check_attention(off_by_one_causal, 1.5, **kw)
    assert not rep.ok
    assert "[causal]" in " ".join(rep.rows[0].notes)


def test_attention_battery_with_all_features_and_gradients():
    rep = check_attention(correct_attention, 2.0, vjp=lambda do, q, k, v, **kw: er.attention_vjp(do, q, k, v, **kw)[:3],
                          features=("causal", "gqa", "key_lengths", "alibi", "asentmax", "cross"), **QUICK)
    assert rep.ok, rep.table()
    assert [r.op for r in rep.rows] == ["attention a=2", "attention a=2", "attention vjp a=2", "attention vjp a=2"]


def test_attention_gradient_reference_is_not_the_numpy_engine(monkeypatch):
    """The reference (dq, dk, dv) come from the dense probabilities and the row VJP, not
    from an attention engine: a numpy engine whose backward is off by 1e-9 in dq fails its
    own battery (with the engine as its own reference it could not fail)."""
    from entmax_ref.backends.numpy_backend import NumpyBackend
    from entmax_ref.testing import _memo

    right = NumpyBackend.attention_backward

    def off(self, *args, **kw):
        g = right(self, *args, **kw)
        dq = g.dq.copy()
        dq.flat[0] += 1e-9
        return g._replace(dq=dq)

    vjp = lambda do, q, k, v, **kw: er.attention_vjp(do, q, k, v, backend="numpy", **kw)[:3]  # noqa: E731
    kw = dict(features=("causal",), dtypes=("float64",), **QUICK)
    assert check_attention(None, 1.5, vjp=vjp, **kw).ok
    monkeypatch.setattr(NumpyBackend, "attention_backward", off)
    _memo.clear()  # no reference kept from the first run
    rep = check_attention(None, 1.5, vjp=vjp, **kw)
    assert not rep.ok
    assert "dq" in " ".join(rep.rows[0].notes), rep.table()


def test_bad_callables_give_failing_rows_not_tracebacks():
    def raises(x, alpha):
        raise RuntimeError("kernel exploded")

    rep = check_entmax(raises, 1.5, **QUICK)
    assert [r.verdict for r in rep.rows] == ["FAIL", "FAIL"]  # both dtypes still ran
    assert "raised RuntimeError: kernel exploded" in rep.rows[0].notes[0]
    rep = check_entmax(lambda: None, 1.5, **QUICK)
    assert "wrong signature" in rep.rows[0].notes[0]
    rep = check_entmax(lambda x, alpha: np.asarray(x)[:, :1], 1.5, **QUICK)
    assert "has shape" in " ".join(rep.rows[0].notes)
    rep = check_entmax(lambda x, alpha: "not an array", 1.5, dtypes=("float64",), **QUICK)
    assert not rep.ok


@pytest.mark.parametrize("battery,fn", [(check_entmax, lambda x, alpha: None),
                                        (check_threshold, lambda x, alpha: None),
                                        (check_entmax_vjp, lambda x, g, alpha: None)])
def test_a_function_returning_none_or_exiting_fails_every_case(battery, fn):
    rep = battery(fn, 1.5, dtypes=("float64",), **QUICK)
    (row,) = rep.rows
    assert row.verdict == "FAIL" and row.cause == "None" and not row.measured
    assert all(c["verdict"] == "FAIL" and c["reason"].endswith("returned None instead of an array") for c in row.cases)

    def exits(*args, **kwargs):
        sys.exit(0)

    (row,) = battery(exits, 1.5, dtypes=("float64",), **QUICK).rows
    assert row.verdict == "FAIL" and row.cause == "exit" and "called sys.exit(0)" in row.notes[0]


def test_a_row_that_compared_nothing_does_not_pass():
    from entmax_ref.testing.report import CheckRow

    row = CheckRow("entmax a=1.5", "mine", "float64")
    row.finish()
    assert row.failed and row.cause == "unmeasured" and "nothing was compared" in row.notes[0]
    skip = CheckRow("entmax a=1.5", "mine", "-", verdict="SKIP")
    skip.finish()
    assert skip.verdict == "SKIP"


def test_report_lines_fit_100_columns_and_rows_say_why_they_failed():
    from entmax_ref.testing.report import CheckReport

    name = "a_rather_long_package.with_modules.inside_it:entmax15_forward_kernel"
    rep = check_entmax(shifted_threshold, 1.5, name=name, **QUICK)
    rep.extend(check_entmax(lambda x: er.entmax(x, 1.25, backend="numpy"), 1.5, name="entmax.entmax_bisect",
                            peer=True, **QUICK))
    rep.rows.append(CheckRow("attention", "adasplash", "-", verdict="SKIP", peer=True,
                             notes=["installed; check it with: entmax-ref check --impl adasplash:adasplash "
                                    "--op attention --framework torch --device cuda"]))
    text = rep.table()
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert len(LEGEND.splitlines()) == 3 and text.count(LEGEND) == 1
    rows = [ln for ln in lines[:lines.index("")] if ln.startswith("entmax a=1.5")]
    assert len(rows) == 4 and all(ln.split()[-2] == "FAIL" and ln.split()[-1] in ("tol", "raised") for ln in rows)
    assert lines.index(next(ln for ln in lines if ln.startswith("peers "))) == 4  # after the two rows of ours
    assert "cases passed/failed/skipped: entmax " in text and ", attention 0/0/1" in text and "failures:" in text
    text = " ".join(text.split())
    assert "SKIP (below)" in text and "skipped: attention / adasplash: installed; check it with: " in text
    assert any("a_rather_lon~orward_kernel" in ln for ln in rows), rows  # its start and its end


def test_a_large_error_within_its_budget_names_the_budget():
    from entmax_ref.testing.assertions import compare
    from entmax_ref.testing.report import CheckReport

    row = CheckRow("vjp a=3", "mine", "float32")
    assert row.judge(compare(np.array([[0.5, 5.0]]), np.array([[0.5, 3.0]]), np.array([[1e-7, 100.0]]),
                             np.float32), "dx", "extreme")
    assert row.max_abs == 2.0 and row.max_ulps > 1e3
    text = " ".join(CheckReport([row]).table().split())
    assert ("large errors within their budget: vjp a=3 / mine / float32: abs err 2 at [extreme] dx (0, 1) is "
            "within its bound 100 (vjp_tolerance, formula 4)") in text
    assert row.cases == [{"tcId": "extreme", "verdict": "PASS", "field": "dx", "worst": [0, 1], "got": "0x1.4p+2",
                          "expected": "0x1.8p+1", "error": 2.0, "bound": 100.0, "reason": ""}]


def test_report_table_and_json(tmp_path):
    rep = check_entmax(lambda x: er.sparsemax(x), 2.0, **QUICK)
    text = rep.table()
    assert text.splitlines()[0].split() == ["operation", "implementation", "dtype", "abs", "err", "ulps",
                                            "err/tol", "props", "verdict"]
    rep.to_json(tmp_path / "r.json")
    import json

    data = json.loads((tmp_path / "r.json").read_text())
    assert data["ok"] and len(data["rows"]) == 2


# ----------------------------------------------------------------------------- adapters


def test_adapters_round_trip_and_do_not_import_frameworks():
    a = np.arange(3.0)
    assert to_numpy(a) is a
    assert to_numpy([1.0, 2.0]).tolist() == [1.0, 2.0]

    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.ones(2)

    assert to_numpy(ArrayLike()).tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="not an array"):
        to_numpy(object())
    code = ("import sys, numpy as np, entmax_ref as er; from entmax_ref.testing import check_entmax; "
            "assert check_entmax(lambda x: er.sparsemax(x, backend='numpy'), 2.0, size='quick').ok; "
            "print(sorted(m for m in ('torch', 'jax', 'cupy', 'hypothesis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_torch_adapter_and_peer():
    torch = pytest.importorskip("torch")
    t = from_numpy(np.ones((2, 3), np.float32), "torch")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    assert to_numpy(t.requires_grad_(True) * 2).tolist() == [[2.0] * 3] * 2
    assert to_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype == np.float32
    rep = check_entmax(lambda x: torch.softmax(x, -1), 1.0, framework="torch", masked_rows=False, **QUICK)
    assert rep.ok, rep.table()


# ----------------------------------------------------------------------------- strategies


@settings(max_examples=15, deadline=None)
@given(attention_problems(asentmax=True))
def test_attention_problems_strategy_is_valid_for_the_reference(problem):
    q, k, v, kw = problem
    assert q.shape[1] % k.shape[1] == 0 and k.shape[2] == v.shape[2]
    out = er.attention(q, k, v, alpha=1.5, backend="numpy", **kw)
    assert out.shape == q.shape[:3] + (v.shape[3],)
    assert np.isfinite(out).all()


@settings(max_examples=10, deadline=None)
@given(alpha_columns(3))
def test_alpha_columns_strategy(a):
    assert a.shape == (3,) and np.all(a >= 1.0)


def test_alpha_is_passed_as_told_never_guessed_from_positions():
    seen = []

    def with_dim(x, dim=-1):  # no alpha parameter: fn(x) computes sparsemax itself
        seen.append(dim)
        return er.sparsemax(x, axis=dim, backend="numpy")

    assert check_entmax(with_dim, 2.0, dtypes=("float64",), **QUICK).ok
    assert set(seen) == {-1}, "alpha was passed into dim"

    def positional(x, a):
        return er.entmax(x, a, backend="numpy")

    assert check_entmax(positional, 1.25, alpha_arg=1, dtypes=("float64",), **QUICK).ok
    rep = check_entmax(positional, 1.25, dtypes=("float64",), **QUICK)  # default: keyword 'alpha'
    assert not rep.ok and "pass alpha_arg=1" in rep.rows[0].notes[0], rep.rows[0].notes

    def named(x, power):
        return er.entmax(x, power, backend="numpy")

    assert check_entmax(named, 1.25, alpha_arg="power", dtypes=("float64",), **QUICK).ok
    rep = check_entmax(named, 1.25, alpha_arg="alfa", dtypes=("float64",), **QUICK)
    assert not rep.ok and "is not a parameter of" in rep.rows[0].notes[0], rep.rows[0].notes
    rep = check_entmax(with_dim, 2.0, alpha_arg=None, dtypes=("float64",), **QUICK)
    assert rep.ok
    vjp = check_entmax_vjp(lambda p, g, a: er.entmax_vjp(p, g, a, backend="numpy"), 1.5, inputs="p",
                           alpha_arg=2, dtypes=("float64",), **QUICK)
    assert vjp.ok
    rep = check_attention(lambda q, k, v, **kw: er.attention(q, k, v, backend="numpy", **kw), 1.5, alpha_arg=1,
                          dtypes=("float64",), size="quick")
    assert not rep.ok and "alpha by keyword" in rep.rows[0].notes[0]


def test_references_are_computed_once_per_problem_and_read_only():
    """entmax_ref.testing._memo: every engine in check is compared with one reference."""
    from entmax_ref.testing import _memo
    from entmax_ref.testing.assertions import attention_reference

    _memo.clear()
    calls = []

    def compute():
        calls.append(1)
        return np.arange(3.0), {"n": 1}

    x = np.array([1.0, 2.0])
    a = _memo.memo("t", compute, x, alpha=1.5, lengths=np.array([1, 2]))
    b = _memo.memo("t", compute, x.copy(), alpha=1.5, lengths=np.array([1, 2]))  # equal values: kept
    assert a is b and len(calls) == 1
    _memo.memo("t", compute, x, alpha=1.5, lengths=np.array([1, 3]))  # an array parameter differs
    _memo.memo("t", compute, x.astype(np.float32), alpha=1.5, lengths=np.array([1, 2]))  # dtype differs
    _memo.memo("u", compute, x, alpha=1.5, lengths=np.array([1, 2]))  # another reference
    assert len(calls) == 4
    with pytest.raises(ValueError):
        a[0][0] = 7.0  # nobody changes what the next caller gets
    _memo.memo("t", compute, np.zeros(_memo.MAX_ELEMENTS + 1))
    _memo.memo("t", compute, np.zeros(_memo.MAX_ELEMENTS + 1))  # too large to keep
    assert len(calls) == 6
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_memo, "MAX_BYTES", 24)  # room for one result of 3 float64: the oldest goes
        _memo.memo("v", compute, np.zeros(1))
        _memo.memo("v", compute, np.ones(1))
        _memo.memo("v", compute, np.ones(1))
        assert len(calls) == 8
        _memo.memo("v", compute, np.zeros(1))
        assert len(calls) == 9

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 4, 3)) for _ in range(3))
    r1 = attention_reference(q, k, v, np.float32, alpha=1.5, causal=True)
    assert attention_reference(q.copy(), k, v, np.float32, alpha=1.5, causal=True) is r1
    assert attention_reference(q, k, v, np.float64, alpha=1.5, causal=True) is not r1
    assert not r1.out.flags.writeable and not r1.tol_p.flags.writeable
