"""Tools for testing entmax implementations against this reference.

* assertions: :func:`assert_entmax_close`, :func:`assert_threshold_close`,
  :func:`assert_entmax_vjp_close`, :func:`assert_attention_close`,
  :func:`assert_attention_grads_close` (they compute the float64 reference themselves);
* tolerances: :mod:`entmax_ref.testing.tolerance` (the documented formula);
* batteries returning a :class:`CheckReport`: :func:`check_entmax`,
  :func:`check_threshold`, :func:`check_entmax_vjp`, :func:`check_attention`,
  :func:`check_normmax`, :func:`check_budget_sparsemax` (with their tolerances in
  :mod:`entmax_ref.testing.family_checks`); the report itself is
  :mod:`entmax_ref.testing.report`, and how a battery calls a function (signature checks,
  where alpha goes, exceptions turned into failing rows) is :mod:`entmax_ref.testing.calling`;
* the built-in corpus: :mod:`entmax_ref.testing.corpus`;
* the conformance corpus on disk (``entmax-ref corpus``): :func:`load_corpus`,
  :func:`replay_corpus` (:mod:`entmax_ref.testing.conformance`);
* adapters: :func:`to_numpy` / :func:`from_numpy` (NumPy, CuPy, PyTorch, JAX, DLPack,
  ``__array__``; a framework is imported only when its objects are involved);
* ``entmax_ref.testing.strategies`` holds Hypothesis strategies (needs ``hypothesis``, from
  the ``test`` extra); it is imported on demand, so ``import entmax_ref.testing`` does not
  require Hypothesis.

The command ``entmax-ref check`` (:mod:`entmax_ref.testing.command`) runs the batteries.
"""

from . import assertions, checks, family_checks, tolerance
from ._adapters import from_numpy, to_numpy
from .assertions import *  # noqa: F403 - the names in assertions.__all__
from .checks import *  # noqa: F403 - the names in checks.__all__
from .family_checks import *  # noqa: F403 - the names in family_checks.__all__
from .conformance import Corpus, CorpusError, load_corpus, replay_corpus

__all__ = sorted([*assertions.__all__, *checks.__all__, *family_checks.__all__, "Corpus", "CorpusError",
                  "from_numpy", "load_corpus", "replay_corpus", "to_numpy", "tolerance"])
