"""Stage 1, ATen graph -> one JAX function: ``lower.py`` walks the graph, ``lowerings/`` holds the
per-op tables, ``custom_ops`` the user's own lowerings, ``refusals`` what eager refuses,
``scan_layers`` repeated blocks as one ``lax.scan``. Imports only ``core``.

Importing this package loads every op table (``lowerings``), so ``lower.py`` reads a complete
``LOWERINGS`` from the registry without importing the tables itself; the tables that lower a
subgraph (flex attention's score_mod) import ``lower`` in turn, and nothing imports in a circle.
"""

from tpu_inductor.lowering import lowerings  # noqa: F401  (each table registers its family)
