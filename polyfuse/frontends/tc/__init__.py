"""The Tensor Comprehensions language: source text -> comprehension IR.

The TC text printed by :mod:`polyfuse.ir.comprehension` parses back here to an equal
IR, so this front end is also the comprehension IR's text parser.
"""

from __future__ import annotations

from polyfuse.errors import TCSemanticError
from polyfuse.frontends.tc.parser import parse_ast
from polyfuse.frontends.tc.sema import analyze_definition
from polyfuse.ir.comprehension import Definition, Module
from polyfuse.ir.verify import verify_definition


def parse(source: str, given_sizes: tuple[str, ...] = ()) -> Module:
    """Parse, check and range-infer every ``def`` in ``source``. Names in ``given_sizes``
    are sizes though no input's shape declares them: the caller gives them (a plan's
    kernel whose output extent or start a plan decides, such as a Range's length;
    :meth:`polyfuse.runtime.kernel.Kernel.specialize_at`)."""
    nodes = parse_ast(source)
    if not nodes:
        raise TCSemanticError("the source holds no 'def'", None, source)
    seen: dict[str, object] = {}
    defs: list[Definition] = []
    for node in nodes:
        if node.name.id in seen:
            raise TCSemanticError(f"definition '{node.name.id}' is defined twice", node.name.loc,
                                  source)
        seen[node.name.id] = node
        d = analyze_definition(node, source, given_sizes)
        verify_definition(d)
        defs.append(d)
    return Module(tuple(defs))


def parse_definition(source: str, given_sizes: tuple[str, ...] = ()) -> Definition:
    """The single ``def`` of ``source`` (``given_sizes``: as :func:`parse`)."""
    module = parse(source, given_sizes)
    if len(module.definitions) != 1:
        raise TCSemanticError(f"expected one definition, found {len(module.definitions)}",
                              None, source)
    return module.definitions[0]


__all__ = ["parse", "parse_definition"]
