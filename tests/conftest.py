"""Shared fixtures: the backend parametrisation, Hypothesis profiles, required backends, tiers.

Two tiers.  ``python -m pytest`` runs the default tier (a few minutes cold on 2 cores):
every public function on every available backend, with property tests at the ``dev``
Hypothesis profile (40 examples a test, the same on every run).  A run over many test
files uses one pytest-xdist worker per CPU (``-n auto`` in pyproject.toml;
:func:`pytest_xdist_auto_num_workers`), after compiling the numba kernels once
(:func:`pytest_collection_finish`).  ``python -m pytest
--exhaustive`` (or ``ENTMAX_REF_EXHAUSTIVE=1``) also runs the tests marked ``exhaustive``
or ``slow`` (nvcc compile, the full oracle sweep, the 65,536-key memory run, installs in
temporary venvs, long inputs) and the long fuzz (the ``ci`` profile unless ``HYPOTHESIS_PROFILE`` names another); ``-m "exhaustive or slow"
--exhaustive`` runs only what the default tier leaves out.

Every test that takes the ``backend`` fixture runs once per registered backend; a backend
that cannot run here is skipped with the reason, unless it is listed in
``--require-backends`` / ``ENTMAX_REF_REQUIRE_BACKENDS``, in which case the skip becomes a
failure (so a GPU job cannot silently skip its GPU tests).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from entmax_ref.backends import capabilities, unavailable_reason

# the default tier draws the same examples on every run (a pass or a failure is reproducible
# from the README's test command alone); the long fuzz draws new ones each run, and prints
# the @reproduce_failure blob of what it finds
settings.register_profile("dev", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("ci", max_examples=150, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=2000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])

_TRUE = ("1", "true", "yes", "on")

BACKENDS = [
    pytest.param("numpy", id="numpy"),
    pytest.param("numba", id="numba", marks=pytest.mark.numba),
    pytest.param("cupy", id="cupy", marks=pytest.mark.cuda),
]
if os.environ.get("ENTMAX_REF_TEST_STRICT", "") not in ("", "0"):
    # the CPU stand-in for a device array type (tests/strict_array.py): every
    # backend-parametrised test also runs on arrays that refuse conversion to NumPy
    import strict_array

    strict_array.register()
    BACKENDS.append(pytest.param(strict_array.NAME, id=strict_array.NAME))


def pytest_addoption(parser):
    parser.addoption(
        "--exhaustive",
        action="store_true",
        default=os.environ.get("ENTMAX_REF_EXHAUSTIVE", "").strip().lower() in _TRUE,
        help="also run the exhaustive tier (tests marked exhaustive or slow) with the long Hypothesis profile",
    )
    parser.addoption(
        "--require-backends",
        default=os.environ.get("ENTMAX_REF_REQUIRE_BACKENDS", ""),
        help="comma-separated backends whose unavailability fails instead of skipping",
    )


def pytest_configure(config):
    exhaustive = config.getoption("--exhaustive")
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if exhaustive else "dev"))


def pytest_collection_modifyitems(config, items):
    if config.getoption("--exhaustive"):
        return
    skip = pytest.mark.skip(reason="exhaustive tier: run with --exhaustive (or ENTMAX_REF_EXHAUSTIVE=1)")
    for item in items:
        if "exhaustive" in item.keywords or "slow" in item.keywords:
            item.add_marker(skip)


#: a session that runs numba tests from at least this many files (the whole tier, not one
#: file) compiles the numba kernels first, in parallel processes, and ``-n auto`` (the
#: default, pyproject.toml) runs its tests in one pytest-xdist worker per CPU
PRECOMPILE_FILES = 8
#: most workers ``-n auto`` starts (each imports numba, torch and jax and collects every test)
MAX_WORKERS = 8


def _test_files(config) -> int:
    """How many test files the command line names (a folder counts its ``test_*.py``)."""
    from pathlib import Path

    args = [a for a in config.args if not a.startswith("-")] or [str(config.rootpath / p) for p in
                                                                  config.getini("testpaths")]
    files = set()
    for a in args:
        path = Path(config.invocation_params.dir, a.split("::")[0])
        if path.is_dir():
            files.update(path.rglob("test_*.py"))
        else:
            files.add(path)
    return len(files)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU (at most :data:`MAX_WORKERS`) for a session over many
    test files, none (the tests run in this process) for one that names a few files or
    tests, so ``python -m pytest tests/test_api.py -k first`` starts at once.
    ``-n N`` on the command line or ``PYTEST_XDIST_AUTO_NUM_WORKERS`` decide instead."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist reads it
    if _test_files(config) < PRECOMPILE_FILES:
        return 0
    from entmax_ref.backends.numba_precompile import default_jobs

    return min(default_jobs(), MAX_WORKERS)


def pytest_collection_finish(session):
    """Compile the numba kernels into the disk cache first, one worker process per CPU
    (:mod:`entmax_ref.backends.numba_precompile`): numba compiles holding the GIL, one at a
    time, and a cold default tier spends most of its time there.  Only for sessions that run
    numba tests from many files, and not with ``ENTMAX_REF_TEST_PRECOMPILE=0``; nothing to
    do when the kernels are cached already.  Under pytest-xdist every worker collects the
    same tests: the first to take the cache's lock compiles, the others wait for it and then
    find nothing left to compile."""
    if os.environ.get("ENTMAX_REF_TEST_PRECOMPILE", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    if unavailable_reason("numba"):
        return
    files = {item.nodeid.split("::")[0] for item in session.items
             if "numba" in item.nodeid and not any(m.name == "skip" for m in item.iter_markers())}
    if len(files) < PRECOMPILE_FILES:
        return
    from entmax_ref.backends.numba._cache import CACHE, CACHE_DIR, file_lock
    from entmax_ref.backends.numba_precompile import compile_kernels

    if not CACHE:
        return
    # pytest-xdist workers and concurrent sessions share the cache: one compiles, the others
    # wait for it and then find the kernels compiled
    with file_lock(CACHE_DIR / ".session-lock"):
        rep = compile_kernels()
    if not (rep["compiled"] or rep["failed"]):
        return
    line = (f"numba kernels compiled ahead: {len(rep['compiled'])} kernel signatures in {rep['seconds']:.1f}s "
            f"({rep['jobs']} processes; failed: {sorted(rep['failed']) or 'none'})")
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: the controller prints it
        session.config.workeroutput["entmax_ref_precompile"] = line
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(line)


_PRECOMPILED = pytest.StashKey[list]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist controller: keep the precompile line of the worker that compiled."""
    line = getattr(node, "workeroutput", {}).get("entmax_ref_precompile")
    if line:
        node.config.stash.setdefault(_PRECOMPILED, []).append(f"{line} [worker {node.gateway.id}]")


#: what a kind of skip needs, and how to run it: (a piece of the skip reasons, the text)
SKIP_KINDS = [
    ("exhaustive tier", "are the exhaustive tier (python -m pytest --exhaustive)"),
    ("cupy", "need cupy and a CUDA GPU (pip install \"entmax-ref[cuda]\")"),
    ("nvcc", "need the CUDA toolkit's nvcc on PATH"),
    ("'torch'", "need torch (pip install -e \".[test]\"; its CPU build: docs/guides/install.md)"),
    ("torch is not installed", "need torch (pip install -e \".[test]\"; its CPU build: docs/guides/install.md)"),
    ("'entmax'", "need the entmax package (pip install -e \".[test]\")"),
    ("entmax package is not installed", "need the entmax package (pip install -e \".[test]\")"),
    ("'array_api_strict'", "need the array_api_strict package (pip install array-api-strict)"),
]


def _skip_kind(report) -> str:
    """What a skipped test needs, from its reason: one of :data:`SKIP_KINDS`, else the reason."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    return next((text for piece, text in SKIP_KINDS if piece in reason), reason)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in config.stash.get(_PRECOMPILED, []):
        terminalreporter.write_line(line)
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    if skipped:  # one closing line: what was skipped and how to run it
        from collections import Counter

        kinds = Counter(_skip_kind(r) for r in skipped).most_common()
        terminalreporter.write_line(f"{len(skipped)} skipped: " + "; ".join(f"{n} {kind}" for kind, n in kinds))


@pytest.fixture(scope="session")
def shared_tmp(tmp_path_factory):
    """``shared_tmp(name, make)``: the folder ``<session tmp>/shared-<name>``, filled once
    per session by ``make(folder)``.  Under pytest-xdist every worker gets the same folder
    (the first to take its lock fills it, the others wait for it), so a costly, deterministic
    fixture (a generated corpus) is built once, not once per worker.  Read-only for tests."""
    import shutil

    from entmax_ref.backends.numba._cache import file_lock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the pytest run's folder, above each worker's own

    def get(name: str, make):
        d = root / f"shared-{name}"
        done = root / f"shared-{name}.done"
        with file_lock(root / f"shared-{name}.lock"):
            if not done.exists():
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(parents=True)
                make(d)
                done.touch()
        return d

    return get


@pytest.fixture(scope="session")
def exhaustive(request) -> bool:
    """Whether this run includes the exhaustive tier (tests may widen their sweeps)."""
    return bool(request.config.getoption("--exhaustive"))


def pytest_report_header(config):
    names = [p.values[0] for p in BACKENDS]
    found = {n: (unavailable_reason(n) or "available") for n in names}
    env = {k: v for k, v in os.environ.items() if k.startswith("ENTMAX_REF_")}
    tier = "exhaustive (default + exhaustive/slow)" if config.getoption("--exhaustive") else "default"
    return [f"entmax-ref backends: {found}", f"ENTMAX_REF_* env: {env}",
            f"tier: {tier}; Hypothesis profile: {settings.get_current_profile_name()}"]


class BackendName(str):
    """A backend name (pass it as ``backend=``) that also moves test data to and from it."""

    def asarray(self, a):
        """``a`` (NumPy data) as an array of this backend's type (a transfer for cupy)."""
        if self == "cupy":
            import cupy

            return cupy.asarray(a)
        if self == "strict":
            import strict_array

            return strict_array.asarray(a)
        return a

    def numpy(self, a):
        return a.get() if hasattr(a, "get") else np.asarray(a)

    def call(self, fn, *args, **kwargs):
        """``fn(*args, backend=self, **kwargs)`` with every NumPy array argument moved to this
        backend's array type and every array in the result moved back to NumPy (tuples,
        NamedTuples and dataclasses included), so a test's NumPy assertions stay as they are."""
        import dataclasses

        def move(a):
            return self.asarray(a) if isinstance(a, np.ndarray) else a

        def back(r):
            if dataclasses.is_dataclass(r) and not isinstance(r, type):
                return dataclasses.replace(r, **{f.name: back(getattr(r, f.name)) for f in dataclasses.fields(r)
                                                 if f.init})
            if isinstance(r, tuple):
                items = [back(x) for x in r]
                return type(r)(*items) if hasattr(r, "_fields") else tuple(items)
            if r is None or isinstance(r, (bool, int, float, str)):
                return r
            return self.numpy(r)

        result = fn(*(move(a) for a in args), backend=self, **{k: move(v) for k, v in kwargs.items()})
        return back(result)


def usable_backend(name: str, config) -> BackendName:
    """``name`` as a BackendName if it can run here; skip (or fail when required) otherwise."""
    reason = unavailable_reason(name)
    if reason is not None:
        required = {s.strip() for s in config.getoption("--require-backends").split(",") if s.strip()}
        if name in required:
            pytest.fail(f"required backend {name!r} is unavailable: {reason}")
        pytest.skip(f"{name}: {reason}")
    return BackendName(name)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> BackendName:
    """A backend name that can run here (skip, or fail when required, otherwise)."""
    return usable_backend(request.param, request.config)


_MARKS = {p.values[0]: p.marks for p in BACKENDS}
#: every (backend, method) pair of the capability table's row transform
METHOD_PAIRS = [
    pytest.param((b, m), id=f"{b}-{m}", marks=_MARKS.get(b, ())) for b, m in capabilities.pairs("entmax_forward")
]


@pytest.fixture(scope="session", params=METHOD_PAIRS)
def backend_method(request) -> tuple[BackendName, str | None]:
    """A ``(backend, method)`` pair from the capability table that can run here."""
    name, method = request.param
    return usable_backend(name, request.config), method
