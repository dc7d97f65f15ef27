"""The documents describe the project as it is: no diary words in any tracked file, a short
README that reaches its first example and its two set-up commands in one screen, a
performance page of current figures, a CHANGELOG by release, and an architecture page
that names every module of the tree."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------
# Words about how the project was made.  Each pattern is assembled from pieces, so that
# this file, which is scanned like every other tracked file, cannot match its own source.
_S, _I, _R = "ses" + "sion", "is" + "sue", "re" + "view"
DIARY = re.compile("|".join([
    rf"\b[Ss]{_S[1:]}s?[- ]#?\d+",            # a numbered work period, "...sion 17", "...sion-14"
    rf"\b[Ss]{_S[1:]}'s\b",                   # "the ...sion's changes"
    rf"\b[Tt]his {_S}\b",                     # "in this ...sion"
    rf"\b[Ii]{_I[1:]}s? #?\d+",               # a tracker reference, "...sue 11", "...sue #12"
    rf"\b[Rr]{_R[1:]}(?:s|ed|ers?)?\b",       # the project's readings of its own code
    r"\bslower " + "VM" + r"\b",              # machines told as anecdotes
    r"\b[Tt]he " + "VM" + r"\b",
]))


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def _text(path: Path) -> str | None:
    """A tracked file's text, or None for a binary file (images, fonts) or a deleted one."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@pytest.mark.parametrize("sample", [
    "measured in " + _S + " 17", "see " + _S.capitalize() + "-14", "after this " + _S + "'s merges",
    "in this " + _S, "the fix of " + _I + " 10", _I.capitalize() + " #12 asks", "found in the " + _R,
    "on the slower " + "VM" + " below", "the " + "VM" + " ran slow",
])
def test_the_diary_pattern_finds_each_kind(sample):
    assert DIARY.search(sample), sample


@pytest.mark.parametrize("sample", [
    "a pytest session fixture", "the test session starts with the compile", "an issued call",
    "preview", "previewed", "the VMs of CI are listed by model", "a 2-core AMD EPYC (Zen 4, AVX-512)",
])
def test_the_diary_pattern_leaves_ordinary_words(sample):
    assert not DIARY.search(sample), sample


def test_no_tracked_file_speaks_of_how_the_project_was_made():
    """Code, tests, docs and the CHANGELOG say what the project is and why; the history of
    its making lives in git.  Every tracked text file is scanned, this one included."""
    found = []
    for path in _tracked_files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in DIARY.finditer(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()[:100]!r}")
    assert not found, f"{len(found)} place(s) speak of how the project was made:\n" + "\n".join(found)


# ---------------------------------------------------------------------------------------
# The README: one screen to the first number.
README = ROOT / "README.md"
MAIN_JOB = "python -m pip install . && entmax-ref check"
TEST_COMMAND = 'python -m pip install -e ".[test]" && python -m pytest'


def test_readme_is_short_and_reaches_its_first_example_in_one_screen():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; at most 150 (details belong in docs/)"
    first = next(n for n, line in enumerate(lines, 1) if line.startswith("```python"))
    assert first <= 40, f"README.md's first Python example starts at line {first}; it must start within 40"


def test_readme_gives_the_two_set_up_commands_and_ci_runs_the_same():
    text = README.read_text(encoding="utf-8")
    commands = [line.strip() for line in text.splitlines() if line.startswith("    python -m pip install")]
    assert commands == [MAIN_JOB, TEST_COMMAND], commands
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    header = "\n".join(line for line in ci.splitlines() if line.startswith("#"))
    for command in (MAIN_JOB, TEST_COMMAND):
        assert command in header, f".ci/run does not name the README's command {command!r}"
    body = [line.strip() for line in ci.splitlines() if not line.lstrip().startswith("#")]
    assert "entmax-ref check" in body and "python -m pip install -q ." in body
    assert any(line.startswith('python -m pip install -q -e ".[test') for line in body)
    assert any(line.startswith("python -m pytest") and "--exhaustive" not in line for line in body)


def test_readme_first_call_paragraph_is_short():
    text = README.read_text(encoding="utf-8")
    paragraph = next(p for p in text.split("\n\n") if p.startswith("**First call.**"))
    assert len(paragraph.splitlines()) <= 6, paragraph



def test_performance_page_is_current_figures_only():
    lines = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"docs/performance.md has {len(lines)} lines; at most 300 (history lives in git)"


def test_changelog_is_organised_by_release():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## (.+)$", text, flags=re.M)
    assert releases and all(r == "Unreleased" or re.fullmatch(r"\d+\.\d+\.\d+( - \d{4}-\d\d-\d\d)?", r)
                            for r in releases), releases
    sections = set(re.findall(r"^### (.+)$", text, flags=re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, sections

# ---------------------------------------------------------------------------------------
# docs/architecture.md: its map of the tree is complete and true.
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: the folders whose every source file the map must name, and what counts as a source file
MAPPED_FOLDERS = ("entmax_ref", "backends")
SOURCE_SUFFIXES = (".py", ".pyi", ".cu", ".cuh", ".cpp")


def _layout_entries() -> dict[str, int]:
    """The paths named by the first fenced block under "## Layout", each with its line in
    the page.  One entry a line: two spaces of indentation a folder level, then the name
    (a folder ends with "/"), then its description."""
    lines = ARCHITECTURE.read_text(encoding="utf-8").splitlines()
    start = lines.index("## Layout")
    fence = next(n for n in range(start, len(lines)) if lines[n].startswith("```"))
    entries: dict[str, int] = {}
    folders: list[str] = []
    for number in range(fence + 1, len(lines)):
        line = lines[number]
        if line.startswith("```"):
            return entries
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0 and indent // 2 <= len(folders), (
            f"docs/architecture.md:{number + 1}: indent by two spaces a level, under a folder entry: {line!r}")
        name = line.split()[0]
        assert re.fullmatch(r"[\w.\-]+/?", name), f"docs/architecture.md:{number + 1}: not a file or folder name: {name!r}"
        del folders[indent // 2:]
        path = "".join(folders) + name
        entries[path.rstrip("/")] = number + 1
        if name.endswith("/"):
            folders.append(name)
    raise AssertionError("docs/architecture.md: the Layout block is not closed")


def _source_files() -> list[str]:
    found = []
    for folder in MAPPED_FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts and path.is_file():
                found.append(path.relative_to(ROOT).as_posix())
    return sorted(found)


def test_architecture_map_names_every_module():
    entries = _layout_entries()
    missing = [path for path in _source_files() if path not in entries]
    assert not missing, (
        "docs/architecture.md, Layout: add a line for each of these (two spaces a folder level, "
        "under its folder's entry, then what it holds):\n  " + "\n  ".join(missing))


def test_architecture_map_names_nothing_that_is_gone():
    gone = [f"line {line}: {path}" for path, line in _layout_entries().items() if not (ROOT / path).exists()]
    assert not gone, "docs/architecture.md, Layout: these entries name files that do not exist:\n  " + "\n  ".join(gone)


def test_architecture_map_test_can_fail(tmp_path, monkeypatch):
    """The map's check finds a module that is not on it, and an entry whose file is gone."""
    page = tmp_path / "architecture.md"
    text = ARCHITECTURE.read_text(encoding="utf-8")
    page.write_text(text.replace("    rows.py ", "    rows_gone.py ", 1), encoding="utf-8")
    monkeypatch.setitem(globals(), "ARCHITECTURE", page)
    entries = _layout_entries()
    assert "backends/numba/rows_gone.py" in entries and "backends/numba/rows.py" not in entries
    with pytest.raises(AssertionError, match="backends/numba/rows.py"):
        test_architecture_map_names_every_module()
    with pytest.raises(AssertionError, match="rows_gone.py"):
        test_architecture_map_names_nothing_that_is_gone()


def test_architecture_contract_table_is_the_protocol():
    """The backend contract's table lists exactly the members of ``Backend``."""
    from entmax_ref.backends._base import Backend

    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("## The backend contract"):]
    section = section[: section.index("\n## ", 1)]
    listed = set(re.findall(r"^\| `(\w+)", section, flags=re.M))
    members = {name for name in vars(Backend) if not name.startswith("_")} | set(Backend.__annotations__)
    assert listed == members, f"in the table only: {sorted(listed - members)}; in the protocol only: {sorted(members - listed)}"
