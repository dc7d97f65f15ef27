"""The corpus's readers outside Python (corpus/v2/runners/): C, JavaScript and Rust.

Each checks a short entmax and its gradient against the pinned corpus's entmax.jsonl and
entmax_vjp.jsonl, every field its tolerance classes name.  The correct implementations pass;
the same readers with a wrong support count (zeros counted) or a wrong threshold (tau left in
the units of x - max x) fail, each on that field alone.  A reader whose tool is not installed
here (no C compiler, node or cargo) is skipped with the reason, and fails where
``ENTMAX_REF_REQUIRE_TOOLS`` names the tool (``cc``, ``node``, ``cargo``: .ci/run does).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cuda_cases import tool_missing

ROOT = Path(__file__).resolve().parents[1]
PINNED = ROOT / "corpus" / "v2"
RUNNERS = PINNED / "runners"

#: per reader: (the implementation's source, its support count, its threshold), each a line of
#: the source and the wrong line CI and these tests put in its place
MUTANTS = {
    "c": ("check_entmax.c", ("*support += p[i] > 0.0;", "*support += p[i] >= 0.0;"),
          ("*tau = alpha == 1.0 ? m + t : a1 * m + t;", "*tau = alpha == 1.0 ? m + t : t;")),
    "js": ("check_corpus.js", ("support: p.filter((v) => v > 0).length", "support: p.filter((v) => v >= 0).length"),
           ("const tau = alpha === 1 ? m + t : a1 * m + t;", "const tau = alpha === 1 ? m + t : t;")),
    "rust": ("rust/examples/check_entmax.rs", ("filter(|v| **v > 0.0)", "filter(|v| **v >= 0.0)"),
             ("let tau = if alpha == 1.0 { m + t } else { a1 * m + t };", "let tau = if alpha == 1.0 { m + t } else { t };")),
}


def mutate(text: str, good: str, bad: str) -> str:
    assert text.count(good) == 1, f"the line {good!r} is not in the reader once"
    return text.replace(good, bad)


def _build(reader: str, folder: Path, source: str, tmp: Path) -> list:
    """The command that runs ``reader`` built from ``folder`` (a copy of runners/ with ``source``
    as its implementation's text)."""
    if reader == "c":
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            tool_missing("cc", "no C compiler")
        (folder / "check_entmax.c").write_text(source)
        exe = tmp / "check_entmax"
        res = subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-O2", "-o", str(exe),
                              str(folder / "check_entmax.c"), "-lm"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return [str(exe)]
    if reader == "js":
        node = shutil.which("node")
        if node is None:
            tool_missing("node", "node is not installed")
        (folder / "check_corpus.js").write_text(source)
        return [node, str(folder / "check_corpus.js")]
    cargo = shutil.which("cargo")
    if cargo is None:
        tool_missing("cargo", "cargo is not installed")
    (folder / "rust" / "examples" / "check_entmax.rs").write_text(source)
    env = dict(os.environ, CARGO_TARGET_DIR=str(tmp.parent / "cargo-target"))
    manifest = str(folder / "rust" / "Cargo.toml")
    res = subprocess.run([cargo, "build", "--offline", "--release", "--quiet", "--manifest-path", manifest,
                          "--example", "check_entmax"], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
    return [str(tmp.parent / "cargo-target" / "release" / "examples" / "check_entmax")]


def run_reader(reader: str, source: str, tmp: Path, corpus: Path = PINNED):
    """(exit status, the FAIL lines, the summary line) of ``reader`` with ``source`` on ``corpus``."""
    folder = tmp / "runners"
    shutil.copytree(RUNNERS, folder, ignore=shutil.ignore_patterns("target", "Cargo.lock"))
    cmd = _build(reader, folder, source, tmp)
    res = subprocess.run([*cmd, str(corpus)], capture_output=True, text=True, timeout=600)
    lines = res.stdout.strip().splitlines()
    return res.returncode, [ln for ln in lines if ln.startswith("FAIL")], lines[-1], res


@pytest.mark.parametrize("reader", list(MUTANTS))
def test_reader_passes_the_correct_entmax_and_counts_per_file_and_class(reader, tmp_path):
    src, _, _ = MUTANTS[reader]
    rc, fails, summary, res = run_reader(reader, (RUNNERS / src).read_text(), tmp_path)
    m = re.fullmatch(r"(\d+) passed, 0 failed, (\d+) skipped", summary)
    assert rc == 0 and m and not fails, res.stdout[-3000:]
    passed, skipped = int(m.group(1)), int(m.group(2))
    counts = {cases["file"]: cases["cases"] for cases in json.loads((PINNED / "manifest.json").read_text())["files"]}
    assert passed + skipped == counts["entmax.jsonl"] + counts["entmax_vjp.jsonl"] and passed > 500
    tallies = [re.fullmatch(r"(\S+) (\S+) (\S+): \d+ passed, \d+ failed, \d+ skipped", ln) for ln in lines(res)]
    fields = {t.groups() for t in tallies if t}
    # every field the two files' classes name, in each of its classes, and the error cases
    assert {("entmax.jsonl", "p", "abs:@tol_p"), ("entmax.jsonl", "tau", "abs:@tol_tau"),
            ("entmax.jsonl", "support", "exact"), ("entmax.jsonl", "support", "abs:@tol_support"),
            ("entmax.jsonl", "error", "invalid-input"), ("entmax_vjp.jsonl", "dx", "abs:@tol_dx")} <= fields, fields


def lines(res):
    return res.stdout.splitlines()


@pytest.mark.parametrize("reader", list(MUTANTS))
@pytest.mark.parametrize("wrong", ["support", "tau"])
def test_reader_fails_a_wrong_support_and_a_wrong_tau_on_that_field(reader, wrong, tmp_path):
    src, support, tau = MUTANTS[reader]
    good, bad = support if wrong == "support" else tau
    rc, fails, summary, res = run_reader(reader, mutate((RUNNERS / src).read_text(), good, bad), tmp_path)
    assert rc == 1 and int(re.search(r"(\d+) failed", summary).group(1)) > 20, summary
    # one line per failing case, naming the case, the field and index, got and expected in hex, the bound
    assert all(re.fullmatch(rf"FAIL entmax-[0-9a-f]{{12}} {wrong}\[0\]: got \S+, expected \S+, bound \S+ \(\S+\)", ln)
               for ln in fails), fails[:5]
    assert len(fails) == int(re.search(r"(\d+) failed", summary).group(1))


def test_c_reader_parses_json_escapes_and_rejects_another_format(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    c = next(c for c in map(json.loads, (PINNED / "entmax.jsonl").read_text().splitlines()) if c["dtype"] == "float32")
    c["why"] = "tab\t quote\" slash\\ snowman \u2603 clef \U0001d11e"
    (d / "entmax.jsonl").write_text(json.dumps(c) + "\n")  # ensure_ascii: \u escapes and a surrogate pair
    (d / "entmax_vjp.jsonl").write_text("")
    rc, fails, summary, res = run_reader("c", (RUNNERS / "check_entmax.c").read_text(), tmp_path, d)
    assert rc == 0 and summary == "1 passed, 0 failed, 0 skipped", res.stdout
    c["schema"]["format"] = 3
    (d / "entmax.jsonl").write_text(json.dumps(c) + "\n")
    res = subprocess.run([str(tmp_path / "check_entmax"), str(d)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "not a format 2 corpus" in res.stderr
