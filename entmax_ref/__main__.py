"""``python -m entmax_ref`` is the ``entmax-ref`` command."""

import sys

from .cli import main

sys.exit(main())
