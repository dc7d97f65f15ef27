"""The claims that ``entmax-ref demo`` plots, asserted on smaller sweeps, and its figures.

The numbers asserted here are properties of the math (digest section 7), not of one run:
exact zeros, exact 1/k, limits, monotone trends.  The sweeps are shorter than the demo's so
the suite stays fast; the demo itself runs the full 2^6 .. 2^20 range.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from entmax_ref import demo

LOG2_N = (6, 8, 10, 12, 14, 16)


@pytest.fixture(scope="module")
def two_level():
    return demo.dispersion_two_level(LOG2_N)


@pytest.fixture(scope="module")
def gauss():
    return demo.dispersion_gaussian((6, 10, 14), seeds=3)


def test_dispersion_two_level(two_level):
    mass, ent, supp = two_level["mass"], two_level["entropy"], two_level["support"]
    n = two_level["n"]
    # softmax: the relevant mass is e / (e + n - 1) -> 0 and the normalised entropy -> 1
    np.testing.assert_allclose(mass["softmax"], np.e / (np.e + n - 1), rtol=1e-12)
    assert np.all(np.diff(mass["softmax"]) < 0) and mass["softmax"][-1] < 1e-4
    assert np.all(ent["softmax"] > 0.99)
    # SSMax with beta = 1 and gap 1: e^{log(n+1)} / (e^{log(n+1)} + n - 1) = (n+1)/(2n) -> 1/2
    np.testing.assert_allclose(mass["SSMax (beta=1)"], (n + 1) / (2 * n), rtol=1e-12)
    # 1.5-entmax below its one-token gap (2): dense, but never below (gap/2)^2 = 1/4
    assert np.all(supp["1.5-entmax"] == n)
    assert np.all(mass["1.5-entmax"] > 0.25) and np.all(np.diff(mass["1.5-entmax"]) < 0)
    # closed form: p = [x/2 - t]_+^2 with (1/2 - t)^2 + (n - 1) t^2 = 1, t = (1 - sqrt(1 + 3n)) / (2n)
    t = (1 - np.sqrt(1 + 3.0 * n)) / (2 * n)
    np.testing.assert_allclose(mass["1.5-entmax"], (0.5 - t) ** 2, rtol=1e-12)
    assert mass["1.5-entmax"][-1] == pytest.approx(0.25, abs=5e-3)
    # ASEntmax with s = log(n + 1)^0.5 >= 2 for n >= 64: exactly one-hot
    assert np.all(mass["ASEntmax (gamma=0.5)"] == 1.0)
    assert np.all(supp["ASEntmax (gamma=0.5)"] == 1) and np.all(ent["ASEntmax (gamma=0.5)"] == 0.0)


def test_dispersion_gaussian(gauss):
    ent, mass = gauss["entropy"], gauss["mass"]
    assert np.all(np.diff(ent["softmax"]) > 0) and ent["softmax"][-1] > 0.94
    assert np.all(np.diff(mass["softmax"]) < 0) and mass["softmax"][-1] < 0.01
    for name in ("1.5-entmax", "ASEntmax (gamma=0.5)", "SSMax (beta=1)"):
        assert ent[name][-1] < ent[name][0] < ent["softmax"][0]
        assert mass[name].min() > 0.2
    assert np.all(gauss["support"]["1.5-entmax"] < gauss["n"])


def test_lemma1_exact():
    res = demo.lemma1(appended=(1, 100, 10_000))
    assert np.all(res["entmax_max_change"] == 0.0)
    assert np.all(res["entmax_appended_mass"] == 0.0)
    assert np.all(np.diff(res["softmax_original_mass"]) < 0) and res["softmax_original_mass"][-1] < 0.05
    assert np.all(res["softmax_max_change"] > 0)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
def test_lemma2_threshold_independent_of_n(alpha):
    ks = (1, 2, 4, 8, 16, 32)
    for entry in demo.lemma2_table(alphas=(alpha,), ks=ks, log2_n=(8, 12)):
        k = entry["k"]
        assert entry["below"] == [2**8, 2**12], entry  # dense just below the gap
        assert entry["above"] == [k, k], entry  # exactly k just above it, at every n
        assert entry["mass_above"] == pytest.approx([1.0, 1.0], abs=1e-12)


def test_lemma2_gap_values():
    np.testing.assert_allclose(demo.lemma2_gap([1, 2, 4, 8, 16, 32], 1.5), [2, 2**0.5, 1, 2**-0.5, 0.5, 2**-1.5])
    np.testing.assert_allclose(demo.lemma2_gap([1, 4, 16], 2.0), [1, 0.25, 0.0625])
    np.testing.assert_allclose(demo.lemma2_gap([1, 16], 1.25), [4.0, 2.0])


def test_lemma2_sweep_softmax_gap_grows_like_log_n():
    res = demo.lemma2_sweep(log2_n=(6, 10))
    on = res["gap"] >= res["threshold"]
    assert np.all(res["entmax"][:, on] == 1.0)  # exactly 1 from the threshold on, at every n
    assert np.all(res["entmax"][:, ~on] < 1.0)
    np.testing.assert_allclose(res["softmax_gap90"], np.log(9 * (res["n"] - 4) / 4))
    # the softmax mass at a fixed gap falls as n grows
    assert np.all(res["softmax"][1] <= res["softmax"][0])


def test_gamma_sign():
    res = demo.gamma_sweep(gammas=(-0.5, 0.0, 0.5), log2_n=(6, 10, 14), seeds=3)
    neg, zero, pos = res["support"]
    assert np.all(np.diff(neg) > 0) and neg[-1] > 4 * neg[0]  # softens: support grows fast
    assert np.all(pos <= zero) and np.all(zero <= neg)  # ordered by gamma at every n
    assert np.all(pos < 8)  # sharpens: the support stays small
    assert res["pmax"][0][-1] < res["pmax"][0][0]
    assert np.all(res["pmax"][2] > res["pmax"][0])


def test_collapse():
    res = demo.collapse(log2_n=(4, 8, 12, 16))
    soft, ent = res["softmax"], res["entmax"]
    # softmax: the weight on the differing token is e^gap / (e^gap + n - 1), falling like 1/n
    n = res["n"]
    for i, gap in enumerate(res["gaps"]):
        np.testing.assert_allclose(soft[i], np.exp(gap) / (np.exp(gap) + n - 1), rtol=1e-10)
    i1, i2 = list(res["gaps"]).index(1.0), list(res["gaps"]).index(2.0)
    np.testing.assert_allclose(ent[i2], 1.0, rtol=0, atol=1e-15)  # gap >= 2: the token takes all
    assert np.all(ent[i1] > 0.25) and ent[i1][-1] == pytest.approx(0.25, abs=5e-3)


@pytest.mark.parametrize("n", [256, 4096, 65536])
def test_alibi_window_exact_and_independent_of_n(n):
    res = demo.alibi_window(n=n)
    for i, m in enumerate(res["slopes"]):
        assert res["farthest"][i] <= res["bound"][i]
        assert res["entmax_beyond"][i] == 0.0
        assert res["softmax_beyond"][i] > 0.0
        assert res["support"][i] == np.count_nonzero(res["entmax"][i])
        assert res["entmax"][i].sum() == pytest.approx(1.0, abs=1e-12)
        assert res["softmax"][i].sum() == pytest.approx(1.0, abs=1e-12)


# ------------------------------------------------------------------------------ figures
def _small_results():
    return {
        "dispersion": (demo.dispersion_two_level((6, 8)), demo.dispersion_gaussian((6, 8), seeds=2)),
        "lemma1": (demo.lemma1(appended=(1, 10)),),
        "lemma2": (demo.lemma2_sweep(log2_n=(6, 8)),),
        "gamma": (demo.gamma_sweep(log2_n=(6, 8), seeds=2),),
        "collapse": (demo.collapse(log2_n=(4, 6)),),
        "alibi": (demo.alibi_window(n=128),),
    }


PLOTTERS = {
    "dispersion": demo.plot_dispersion,
    "lemma1": demo.plot_lemma1,
    "lemma2": demo.plot_lemma2,
    "gamma": demo.plot_gamma,
    "collapse": demo.plot_collapse,
    "alibi": demo.plot_alibi,
}


def test_every_demo_has_a_figure_and_a_caption():
    assert set(demo.DEMOS) == set(demo.FIGURES) == set(demo.CAPTIONS) == set(PLOTTERS)


def test_each_figure_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    for name, args in _small_results().items():
        path = PLOTTERS[name](*args, str(tmp_path))
        assert path == str(tmp_path / demo.FIGURES[name])
        data = (tmp_path / demo.FIGURES[name]).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def test_command_writes_figures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert demo.main(["--out", str(tmp_path / "figs"), "--only", "lemma1", "collapse"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "figs" / "lemma1.png").is_file() and (tmp_path / "figs" / "collapse.png").is_file()
    assert "Lemma 1" in out and demo.CAPTIONS["collapse"] in out


def test_command_defaults_to_current_directory(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    assert demo.main(["--only", "lemma1"]) == 0
    assert (tmp_path / "lemma1.png").is_file()


def test_command_without_matplotlib_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert demo.main(["--out", str(tmp_path), "--only", "lemma1"]) == 1
    err = capsys.readouterr().err
    assert "entmax-ref[plot]" in err and "matplotlib" in err
    assert not list(tmp_path.iterdir())


def test_tables_only_needs_no_matplotlib(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert demo.main(["--no-plots", "--only", "lemma1"]) == 0
    assert "Lemma 1" in capsys.readouterr().out


def test_cli_dispatches_to_demo(tmp_path, capsys):
    from entmax_ref import cli

    assert cli.main(["demo", "--no-plots", "--only", "lemma1"]) == 0
    assert "Lemma 1" in capsys.readouterr().out
