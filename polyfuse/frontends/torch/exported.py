"""``torch.export`` programs (in memory or saved as ``.pt2``) -> graph IR.

The program is first decomposed to core ATen ops (``run_decompositions``); parameters,
buffers and lifted constants become the graph's constants and the user's inputs its
inputs, named as the program names them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from polyfuse.errors import ModelError, UnsupportedOpError
from polyfuse.frontends.torch.convert import to_graph, to_numpy
from polyfuse.ir.graph import Graph


def load_exported(path: str | os.PathLike) -> ExportedProgram:
    """The program ``torch.export.save`` wrote to ``path``."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"no exported program at '{path}'")
    try:
        return torch.export.load(str(path))
    except Exception as err:  # zip, pickle and version errors of many kinds
        raise ModelError(f"cannot read the exported program '{path}': {err}") from None


def from_exported(program: ExportedProgram | str | os.PathLike, name: str | None = None) -> Graph:
    """The graph IR of an exported program (or of a ``.pt2`` file)."""
    if not isinstance(program, ExportedProgram):
        name = name or Path(program).stem
        program = load_exported(program)
    program = program.run_decompositions()
    sig = program.graph_signature
    mutated = [s.target for s in sig.output_specs if s.kind is not OutputKind.USER_OUTPUT]
    if mutated:
        raise UnsupportedOpError(f"the program updates {', '.join(map(str, mutated))} in place "
                                 "(buffer mutations); polyfuse compiles programs without side effects")
    weights: dict[str, Any] = {}
    for spec in sig.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            tensor = program.state_dict.get(spec.target)
            if tensor is None:   # non-persistent buffers live with the constants
                tensor = program.constants[spec.target]
        elif spec.kind is InputKind.CONSTANT_TENSOR:
            tensor = program.constants[spec.target]
        else:
            continue
        weights[spec.arg.name] = to_numpy(tensor)
    return to_graph(program.graph_module, constants=weights, name=name or "exported")
