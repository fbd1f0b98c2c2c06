"""Stage 2, a Dynamo graph -> functional Core ATen: the AOTAutograd configuration and decompositions
(``aot``), the multi-tensor decompositions (``foreach``), and the split of a graph around ops
that run in torch (``partition``). Imports ``core`` and ``lowering``.
"""
