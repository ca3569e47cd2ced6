"""numpy-style einsum subscripts -> a TC definition."""

from __future__ import annotations

from collections.abc import Sequence

from polyfuse.errors import ArgumentError
from polyfuse.ir.types import DType

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _expand(term: str, rank: int | None, ellipsis: str, which: str) -> str:
    if "..." not in term:
        if rank is not None and len(term) != rank:
            raise ArgumentError(f"einsum: {which} has subscripts '{term}' ({len(term)} indices) "
                                f"but rank {rank}")
        return term
    if term.count("...") > 1:
        raise ArgumentError(f"einsum: {which} uses '...' twice")
    if rank is not None:
        n = rank - (len(term) - 3)
        if n < 0 or n > len(ellipsis):
            raise ArgumentError(f"einsum: {which} has subscripts '{term}' but rank {rank}")
        ellipsis = ellipsis[len(ellipsis) - n:]
    return term.replace("...", ellipsis)


def einsum_source(subscripts: str, dtypes: Sequence[DType], ranks: Sequence[int]) -> str:
    """The TC ``def einsum(...)`` computing ``np.einsum(subscripts, *operands)``."""
    spec = subscripts.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(dtypes):
        raise ArgumentError(f"einsum: subscripts '{subscripts}' name {len(terms)} operand"
                            f"{'s' if len(terms) != 1 else ''}, got {len(dtypes)}")
    for ch in spec:
        if ch not in _LETTERS and ch not in ",.->":
            raise ArgumentError(f"einsum: invalid character {ch!r} in subscripts '{subscripts}'")
    used = set("".join(terms))
    free = [c for c in _LETTERS if c not in used]
    widest = max((r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t), default=0)
    ellipsis = "".join(free[:widest])
    terms = [_expand(t, r, ellipsis, f"operand {k}") for k, (t, r) in enumerate(zip(terms, ranks))]
    if not arrow:
        counts = {c: "".join(terms).count(c) for c in "".join(terms)}
        output = ellipsis + "".join(sorted((c for c, n in counts.items() if n == 1 and c not in ellipsis),
                                           key=_LETTERS.index))
    else:
        output = _expand(output, None, ellipsis, "the output")
    for c in output:
        if output.count(c) > 1:
            raise ArgumentError(f"einsum: output index '{c}' appears twice")
        if c not in "".join(terms):
            raise ArgumentError(f"einsum: output index '{c}' appears in no operand")
    sizes = {c: f"N_{c}" for c in _LETTERS}
    params = ", ".join(f"{dt}({', '.join(sizes[c] for c in t)}) T{k}"
                       for k, (t, dt) in enumerate(zip(terms, dtypes)))
    body = " * ".join(f"T{k}({', '.join(t)})" for k, t in enumerate(terms))
    reduced = set("".join(terms)) - set(output)
    op = "+=!" if reduced else "="
    return f"def einsum({params}) -> (O) {{\n  O({', '.join(output)}) {op} {body}\n}}\n"
