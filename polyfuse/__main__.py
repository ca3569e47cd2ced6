"""``python -m polyfuse``: the command line (see :mod:`polyfuse.cli`)."""

import sys

from polyfuse.cli import main

if __name__ == "__main__":
    sys.exit(main())
