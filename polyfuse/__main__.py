"""``python -m polyfuse``: the command line (see :mod:`polyfuse.cli`)."""

import sys

from polyfuse.cli import main

sys.exit(main())
