"""What LLVM writes on stderr, caught.

LLVM reports to the process's stderr (file descriptor 2) and llvmlite offers no
diagnostic handler: an optimization it was asked for and could not do prints
"loop not vectorized" remarks, an unknown CPU name prints a line and goes on. Compiling
must be quiet, so the calls that can print run with descriptor 2 sent to a file; what
was caught is returned, and the optimization remarks go to the ``polyfuse.llvm`` logger
(shown by ``polyfuse --verbose``). Callers hold the compile lock, so no other thread's
output is caught on the way; whatever is not a remark is written back to stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

_LOG = logging.getLogger("polyfuse.llvm")
# "remark: <unknown>:0:0: loop not vectorized: ..." and the warning that follows it
_REMARK = re.compile(r"^(remark|warning): [^:]*:\d+:\d+: (loop not (vectorized|unrolled|interleaved)"
                     r"|the optimizer was unable)")


@contextlib.contextmanager
def caught_stderr() -> Iterator[list[str]]:
    """Run the block with file descriptor 2 sent to a file; the list it yields holds
    what was written there, as one string, once the block ends."""
    said: list[str] = []
    with tempfile.TemporaryFile() as caught:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(caught.fileno(), 2)
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            said.append(caught.read().decode(errors="replace"))


@contextlib.contextmanager
def quiet_remarks() -> Iterator[None]:
    """Run an LLVM optimization with its remarks sent to the ``polyfuse.llvm`` logger
    at debug level; anything else it prints still reaches stderr."""
    with caught_stderr() as said:
        yield
    rest = []
    for line in said[0].splitlines():
        if _REMARK.match(line):
            _LOG.debug("%s", line)
        elif line.strip():
            rest.append(line)
    if rest:
        sys.stderr.write("\n".join(rest) + "\n")
