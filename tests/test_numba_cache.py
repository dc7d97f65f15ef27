"""The numba kernels' disk cache: outside the package, keyed on every kernel source; a
damaged or unwritable cache is a miss, never an error; nothing but ``entmax-ref cache
clear`` deletes a cache folder.

Regressions: cache files were written into the installed package, numba's per-file stamp
missed changes to helpers in other files, a damaged entry failed the call with numba's
loader error, and importing deleted the folders of other versions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")

from entmax_ref.backends.numba import _cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    pkg = tmp_path / "pkg"
    kern = pkg / "kern"
    kern.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "consts.py").write_text("LIMIT = 10\n")
    (pkg / "unrelated.py").write_text("X = 1\n")
    (kern / "__init__.py").write_text("")
    (kern / "helpers.py").write_text("def helper(x):\n    return x + 1\n")
    (kern / "rows.py").write_text("from .helpers import helper\nfrom ..consts import LIMIT\n")
    return pkg, kern


def test_key_covers_every_kernel_file_and_the_package_modules_they_import(tmp_path):
    pkg, kern = _tree(tmp_path)
    files = {p.relative_to(pkg).as_posix() for p in _cache.kernel_sources(kern, pkg)}
    assert files == {"kern/__init__.py", "kern/helpers.py", "kern/rows.py", "consts.py"}
    key = _cache.source_key(kern, pkg)
    assert key == _cache.source_key(kern, pkg)
    # unrelated module: same key
    (pkg / "unrelated.py").write_text("X = 2\n")
    assert _cache.source_key(kern, pkg) == key
    # a helper in another file than the kernel (numba's own stamp misses this one)
    (kern / "helpers.py").write_text("def helper(x):\n    return x + 2\n")
    key2 = _cache.source_key(kern, pkg)
    assert key2 != key
    # an imported constant
    (pkg / "consts.py").write_text("LIMIT = 11\n")
    key3 = _cache.source_key(kern, pkg)
    assert key3 not in (key, key2)
    # a new kernel file (e.g. a new transform's kernels) is covered without registration
    (kern / "newkernels.py").write_text("Y = 0\n")
    assert _cache.source_key(kern, pkg) not in (key, key2, key3)


def test_the_real_key_covers_every_file_of_the_numba_folder():
    sources = set(_cache.kernel_sources())
    assert set(p.resolve() for p in _cache.KERNEL_DIR.rglob("*.py")) <= sources
    assert _cache.CACHE_DIR.name == _cache.KEY
    assert _cache.KERNEL_DIR not in _cache.CACHE_DIR.parents


def _run(code: str, env: dict[str, str], cwd: Path = ROOT) -> dict:
    full = {**os.environ, **env}
    full.pop("NUMBA_CACHE_DIR", None)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


_COMPILE_ONE = """
    import json, numpy as np
    from entmax_ref.backends.numba._jit import jit
    from entmax_ref.backends.numba import candidates, _cache
    row_max = jit(no_cpython_wrapper=False)(lambda x: candidates._row_max(x))  # the helper, from Python
    row_max(np.zeros(3))
    st = candidates._row_max.stats
    print(json.dumps({"dir": str(_cache.CACHE_DIR), "cache": _cache.CACHE,
                      "hits": sum(st.cache_hits.values()), "misses": sum(st.cache_misses.values()),
                      "path": candidates._row_max._cache.cache_path}))
"""


def test_compiled_code_goes_to_the_user_cache_dir_and_is_reused(tmp_path):
    before = {p for p in _cache.KERNEL_DIR.rglob("*") if p.suffix in (".nbi", ".nbc")}
    env = {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c"), "ENTMAX_REF_NUMBA_CACHE": "1"}
    first = _run(_COMPILE_ONE, env)
    assert first["cache"] and first["misses"] == 1 and first["hits"] == 0
    assert Path(first["dir"]).parent.parent == (tmp_path / "c").resolve()
    assert Path(first["path"]) == Path(first["dir"])
    assert list(Path(first["dir"]).glob("candidates._row_max-*.nbi"))
    second = _run(_COMPILE_ONE, env)
    assert second["hits"] == 1 and second["misses"] == 0
    after = {p for p in _cache.KERNEL_DIR.rglob("*") if p.suffix in (".nbi", ".nbc")}
    assert after == before, "cache files were written inside the package"


def test_unwritable_cache_dir_turns_caching_off_instead_of_writing_the_package(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out = _run(_COMPILE_ONE, {"ENTMAX_REF_CACHE_DIR": str(blocker), "ENTMAX_REF_NUMBA_CACHE": "1"})
    assert out["cache"] is False and out["hits"] == 0
    assert not list(_cache.KERNEL_DIR.rglob("candidates._row_max-*.nbi"))


def test_other_numba_functions_keep_numbas_own_cache(tmp_path):
    (tmp_path / "mine.py").write_text("from numba import njit\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    code = """
        import json, sys
        sys.path.insert(0, %r)
        import entmax_ref.backends.numba, mine
        mine.f(1.0)
        print(json.dumps({"path": mine.f._cache.cache_path}))
    """ % str(tmp_path)
    out = _run(code, {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c")})
    assert Path(out["path"]) == tmp_path / "__pycache__"


def test_concurrent_saves_of_one_kernel_keep_every_signature(tmp_path, monkeypatch):
    """Two processes (here: threads with their own file handles) that save two signatures of
    one kernel at the same time: numba reads the index, picks the first free data file and
    writes the index back with no lock, so both took file 1 and one entry was lost (or
    pointed at the other's code).  Under the cache's lock both entries survive, each with
    its own data (the cache's own index file class; numba's is left as it is)."""
    import threading
    import time

    from numba.core import caching

    from entmax_ref.backends.numba import _cache

    if not _cache.CACHE:
        pytest.skip("the kernel cache is off")
    folder = _cache.CACHE_DIR / "race-test"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        load = caching.IndexDataCacheFile._load_index

        def slow_load(self):  # widen the read-modify-write window
            out = load(self)
            time.sleep(0.3)
            return out

        monkeypatch.setattr(caching.IndexDataCacheFile, "_load_index", slow_load)
        files = [_cache._IndexDataFile(str(folder), "kernel-1", "stamp") for _ in range(2)]
        threads = [threading.Thread(target=f.save, args=(f"sig{i}", f"code{i}")) for i, f in enumerate(files)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        monkeypatch.undo()
        fresh = caching.IndexDataCacheFile(str(folder), "kernel-1", "stamp")
        assert fresh.load("sig0") == "code0"
        assert fresh.load("sig1") == "code1"
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


_ROW_MAX = """
    import json, numpy as np
    from entmax_ref.backends.numba._jit import jit
    from entmax_ref.backends.numba import candidates, _cache
    row_max = jit(no_cpython_wrapper=False)(lambda x: candidates._row_max(x))  # the helper, from Python
    x = np.random.default_rng(0).standard_normal(37)
    got = float(row_max(x))
    st = candidates._row_max.stats
    print(json.dumps({"dir": str(_cache.CACHE_DIR), "cache": _cache.CACHE, "right": got == float(x.max()),
                      "hits": sum(st.cache_hits.values()), "misses": sum(st.cache_misses.values())}))
"""


def _damage_truncated_data(folder: Path) -> None:
    (data,) = folder.glob("candidates._row_max-*.nbc")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


def _damage_corrupt_index(folder: Path) -> None:
    (index,) = folder.glob("candidates._row_max-*.nbi")
    raw = index.read_bytes()
    index.write_bytes(raw[:24] + bytes(b ^ 0x5A for b in raw[24:]))


def _damage_empty_index(folder: Path) -> None:
    (index,) = folder.glob("candidates._row_max-*.nbi")
    index.write_bytes(b"")


@pytest.mark.parametrize("damage", [_damage_truncated_data, _damage_corrupt_index, _damage_empty_index],
                         ids=["truncated-nbc", "corrupt-nbi", "empty-nbi"])
def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path, damage):
    """numba's loader raised UnpicklingError / EOFError / MemoryError from the next call."""
    env = {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c"), "ENTMAX_REF_NUMBA_CACHE": "1"}
    first = _run(_ROW_MAX, env)
    assert first["cache"] and first["right"] and first["misses"] == 1
    damage(Path(first["dir"]))
    again = _run(_ROW_MAX, env)  # the damaged entry: a miss, compiled again, same answer
    assert again["right"] and again["hits"] == 0 and again["misses"] == 1
    replaced = _run(_ROW_MAX, env)  # the entry was replaced: loaded from the cache
    assert replaced["right"] and replaced["hits"] == 1 and replaced["misses"] == 0


def test_a_cache_folder_below_a_file_runs_uncached(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out = _run(_ROW_MAX, {"ENTMAX_REF_CACHE_DIR": str(blocker / "below"), "ENTMAX_REF_NUMBA_CACHE": "1"})
    assert out["cache"] is False and out["right"] and out["hits"] == 0


def test_a_cache_folder_that_becomes_unwritable_runs_uncached(tmp_path):
    """The folder was writable at import and is not when the kernel saves (replaced by a
    regular file, which defeats even root): numba's save raised from the call."""
    code = """
        import json, shutil, numpy as np
        from entmax_ref.backends.numba._jit import jit
        from entmax_ref.backends.numba import candidates, _cache
        row_max = jit(no_cpython_wrapper=False)(lambda x: candidates._row_max(x))  # the helper, from Python
        shutil.rmtree(_cache.CACHE_DIR)
        _cache.CACHE_DIR.write_text("not a folder")
        x = np.random.default_rng(0).standard_normal(37)
        print(json.dumps({"cache": _cache.CACHE, "right": float(row_max(x)) == float(x.max())}))
    """
    out = _run(code, {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c"), "ENTMAX_REF_NUMBA_CACHE": "1"})
    assert out == {"cache": True, "right": True}


def test_other_versions_folders_survive_import_and_calls(tmp_path):
    """Importing pruned the folders of other kernel versions unused for two weeks."""
    sibling = tmp_path / "c" / "numba" / "0123456789abcdef0123"
    sibling.mkdir(parents=True)
    (sibling / "x.nbi").write_text("")
    os.utime(sibling, (1, 1))
    out = _run(_ROW_MAX, {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c"), "ENTMAX_REF_NUMBA_CACHE": "1"})
    assert out["right"] and Path(out["dir"]).parent == sibling.parent.resolve()
    assert (sibling / "x.nbi").exists()


def test_numba_outside_the_tested_versions_runs_uncached(tmp_path):
    """On a numba release outside the tested range the kernels run uncached and the
    score products take numba's public ``np.dot`` instead of its BLAS wrapper, with the
    same answers (to a thousand ulps of the dtype: the products' rounding only)."""
    from entmax_ref.backends.cache_folder import tested

    assert tested("0.59.1") and tested("0.68.1")
    assert not tested("0.58.1") and not tested("0.69.0") and not tested("dev")
    code = """
        import importlib.metadata as md
        import json, numpy as np
        real = md.version
        md.version = lambda name: "0.99.0" if name == "numba" else real(name)  # the version the cache reads
        import entmax_ref as er
        from entmax_ref.backends.numba._jit import jit
        from entmax_ref.backends.numba import candidates, products, _cache
        row_max = jit(no_cpython_wrapper=False)(lambda x: candidates._row_max(x))  # the helper, from Python
        x = np.random.default_rng(0).standard_normal(37)
        right = {"rows": float(row_max(x)) == float(x.max())}
        for dt in (np.float32, np.float64):  # the score products through numba's public np.dot
            q = np.random.default_rng(1).standard_normal((1, 2, 300, 16)).astype(dt)
            for a in (1.0, 1.5):
                o = er.attention(q, q, q, alpha=a, causal=True, backend="numba")
                right[f"{dt.__name__} {a}"] = bool(np.allclose(
                    o, er.attention(q, q, q, alpha=a, causal=True, backend="numpy"), atol=1024 * float(np.finfo(dt).eps)))
        print(json.dumps({"cache": _cache.CACHE, "direct_blas": products.DIRECT_BLAS, "right": right}))
    """
    out = _run(code, {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c"), "ENTMAX_REF_NUMBA_CACHE": "1"})
    assert out["cache"] is False and out["direct_blas"] is False and all(out["right"].values()), out


_NUMBA_STATE = """
    import json
    from numba.core import caching, dispatcher, registry

    def state():
        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
        classes = (caching.IndexDataCacheFile, caching.FunctionCache, caching.Cache, impl, dispatcher.Dispatcher,
                   registry.CPUDispatcher)
        return [[c.__name__, sorted((k, repr(v)) for k, v in vars(c).items())] for c in classes] + [
            [repr(c) for c in impl._locator_classes]]

    before = state()
    import numpy as np
    import entmax_ref as er
    x = np.random.default_rng(0).standard_normal((8, 300))
    er.entmax15(x, backend="numba")
    er.entmax15(x)
    print(json.dumps({"same": state() == before, "cached": bool(list(__import__("pathlib").Path(%r).rglob("*.nbi")))}))
"""


def test_a_library_call_leaves_numbas_classes_as_they_were(tmp_path):
    """Importing entmax_ref and running its kernels (compiled into and loaded from its
    cache) changes no attribute of numba's cache, locator list or dispatcher classes: the
    kernels' cache is a class of their own, set on their own dispatchers."""
    cache = tmp_path / "c"
    for _ in range(2):  # compiled and saved, then loaded
        out = _run(_NUMBA_STATE % str(cache), {"ENTMAX_REF_CACHE_DIR": str(cache), "ENTMAX_REF_NUMBA_CACHE": "1"})
        assert out == {"same": True, "cached": True}


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "entmax_ref", *args], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=600)


_CLEAR_KEEPING_FILES = textwrap.dedent("""
    import shutil, sys
    from entmax_ref.backends.cache_folder import CACHE_DIR
    from entmax_ref.cli import main
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    (CACHE_DIR / "kern.nbi").write_bytes(b"x" * 1000)
    # a folder whose files cannot be removed (read-only, or another user's): rmtree with
    # ignore_errors removes nothing and says nothing, as it does there
    real = shutil.rmtree
    shutil.rmtree = lambda path, ignore_errors=False, **kw: None if ignore_errors else real(path, **kw)
    sys.exit(main(["cache", "clear"]))
""")


def test_cache_clear_of_a_folder_it_cannot_remove_says_so_and_fails(tmp_path):
    env = {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c")}
    res = subprocess.run([sys.executable, "-c", _CLEAR_KEEPING_FILES], cwd=ROOT, env={**os.environ, **env},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "removed" not in res.stdout and "Traceback" not in res.stderr
    assert res.stderr.startswith("entmax-ref cache clear: could not remove ")
    assert "1 file (1000 bytes) left" in res.stderr and res.stderr.count("\n") == 1


def test_cache_info_and_clear(tmp_path):
    env = {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c"), "ENTMAX_REF_NUMBA_CACHE": "1"}
    sibling = tmp_path / "c" / "numba" / "0123456789abcdef0123"
    sibling.mkdir(parents=True)
    (sibling / "x.nbi").write_text("kept")
    folder = Path(_run(_ROW_MAX, env)["dir"])
    info = _cli(["cache", "info"], env)
    assert info.returncode == 0, info.stderr
    assert f"kernel cache: {folder}" in info.stdout and "caching: on" in info.stdout
    assert "complete: no" in info.stdout and str(sibling) in info.stdout
    assert " 0 kernels" not in info.stdout and "kernels" in info.stdout
    cleared = _cli(["cache", "clear"], env)
    assert cleared.returncode == 0, cleared.stderr
    assert f"removed {folder}" in cleared.stdout
    assert not folder.exists() and (sibling / "x.nbi").read_text() == "kept"
    assert _cli(["cache", "bogus"], env).returncode == 2


_FULL_DISK = """
    import errno, json, numpy as np
    from numba.core import caching
    import entmax_ref as er

    def full(self, name, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    if %r:
        caching.IndexDataCacheFile._save_data = full  # every write of compiled code fails
    from entmax_ref.backends.numba_precompile import tasks
    x = np.random.default_rng(0).standard_normal((6, 40))
    p = er.entmax(x, 1.5, backend="numpy")
    (task,) = [t for t in tasks(["entmax_vjp"], ["float64"]) if t.kernel == "grads._vjp_cr"]
    before = task.compiled()
    dx = er.entmax_vjp(p, x, 1.5, backend="numba")
    print(json.dumps({"before": before, "after": task.compiled(),
                      "right": bool(np.allclose(dx, er.entmax_vjp(p, x, 1.5, backend="numpy"), atol=1e-15))}))
"""


def test_a_full_disk_is_a_miss_never_a_false_compiled(tmp_path):
    """The kernels compile and answer while every save fails (ENOSPC); the next process
    finds them not compiled (a marker once said they were, and that process compiled in
    the caller for seconds), compiles them, saves them, and the one after loads them."""
    env = {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c"), "ENTMAX_REF_NUMBA_CACHE": "1"}
    full = _run(_FULL_DISK % True, env)
    assert full == {"before": False, "after": True, "right": True}  # compiled in that process only
    assert not [f for f in (tmp_path / "c").rglob("grads._vjp_cr-*") if f.suffix in (".nbi", ".nbc")]
    info = _cli(["cache", "info"], env)
    assert "complete: no" in info.stdout, info.stdout
    assert _run(_FULL_DISK % False, env) == {"before": False, "after": True, "right": True}
    assert _run(_FULL_DISK % False, env) == {"before": True, "after": True, "right": True}


_INTERRUPTED = """
    import json, numpy as np
    from numba.core import event
    import entmax_ref as er
    from entmax_ref.backends.numba._jit import jit
    from entmax_ref.backends.numba import candidates, rows
    row_max = jit(no_cpython_wrapper=False)(lambda x: candidates._row_max(x))  # the helper, from Python

    class Interrupt(event.Listener):  # Ctrl-C as the first compile of gather_alive ends
        def on_start(self, ev):
            pass
        def on_end(self, ev):
            if ev.data["dispatcher"].py_func.__name__ == "gather_alive":
                raise KeyboardInterrupt

    listener = Interrupt()
    event.register("numba:compile", listener)
    x = np.random.default_rng(0).standard_normal((6, 300))
    try:
        er.entmax15(x, backend="numba")
        first = "finished"
    except KeyboardInterrupt:
        first = "interrupted"
    event.unregister("numba:compile", listener)
    kept = {f.__name__: len(f.signatures) for f in (candidates.gather_alive, candidates._mask_alive, rows.solve_15)}
    from numba.core.codegen import CPUCodeLibrary
    real = CPUCodeLibrary.serialize_using_object_code

    def broken(self):  # what the interrupted compile once left: a library with no object code
        if "_mask_alive" in self.name:
            raise RuntimeError(f"no compiled object yet for {self}")
        return real(self)

    CPUCodeLibrary.serialize_using_object_code = broken
    p = er.entmax15(x, backend="numba")
    print(json.dumps({"first": first, "kept": kept,
                      "right": bool(np.allclose(p, er.entmax15(x, backend="numpy"), atol=1e-15))}))
"""


def test_an_interrupted_first_compile_leaves_a_working_dispatcher(tmp_path):
    """Ctrl-C during the first compile: the specializations made during it are dropped (a
    half-made one is never kept), and the next call in the same process compiles them
    again and answers, even when saving one of them to the cache fails (a save that
    raises is a miss: the call once failed with "no compiled object yet for <Library
    '_mask_alive'>")."""
    out = _run(_INTERRUPTED, {"ENTMAX_REF_CACHE_DIR": str(tmp_path / "c"), "ENTMAX_REF_NUMBA_CACHE": "1"})
    assert out == {"first": "interrupted", "kept": {"gather_alive": 0, "_mask_alive": 0, "solve_15": 0},
                   "right": True}
