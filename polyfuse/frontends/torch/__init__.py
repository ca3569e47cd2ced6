"""PyTorch front end: FX graphs of core ATen ops (torch.export, AOTAutograd) -> graph IR.

:func:`to_graph` converts an FX ``GraphModule``; :func:`from_exported` an
``ExportedProgram`` (its parameters and buffers become constants) or a ``.pt2`` file
``torch.export.save`` wrote; :func:`rejection` says whether one node can be lowered,
which is what the torch.compile backend partitions by. torch is imported here and in
``polyfuse.torch`` only.
"""

from polyfuse.frontends.torch.convert import Rejection, to_graph, to_numpy
from polyfuse.frontends.torch.exported import from_exported, load_exported
from polyfuse.frontends.torch.support import rejection

__all__ = ["Rejection", "from_exported", "load_exported", "rejection", "to_graph", "to_numpy"]
