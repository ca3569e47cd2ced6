"""Schedules stated for an AVX-512 machine: where a test expects the loop IR of 16-lane
float vectors, it compiles for ``x86:sapphirerapids`` (AVX-512, 32 vector registers, a
2 MiB L2 in the machine model: the machine the heuristics' expectations were measured
on) whatever the host is (the kernel is compiled, never called: the host may lack
AVX-512), and runs the host's own kernel against numpy."""

import polyfuse as pf

AVX512 = "x86:sapphirerapids"


def avx512_loops(src: str, *args, entry: str | None = None) -> str:
    """The loop IR of ``src``'s definition ``entry`` (its only one by default) compiled
    for :data:`AVX512` at the shapes of ``args``."""
    module = pf.define(src, target=AVX512)
    if entry is None:
        (entry,) = (name for name in dir(module) if not name.startswith("_"))
    return getattr(module, entry).specialize(*args).stages["loops"]
