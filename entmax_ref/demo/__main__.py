"""``python -m entmax_ref.demo``: the same as ``entmax-ref demo``."""

import sys

from .cli import main

sys.exit(main())
