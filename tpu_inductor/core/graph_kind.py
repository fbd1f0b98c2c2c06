"""Which of AOTAutograd's compilers a captured graph reached: :class:`GraphKind`."""

from __future__ import annotations

import enum


class GraphKind(enum.StrEnum):
    """A training forward, its backward, or an inference graph (any graph AOTAutograd does not
    split: ``compile_step``'s whole step is one). A str enum, so it prints, compares and
    serializes as its value: graph names, logs and ``cache_dir`` manifests show the value."""

    FORWARD = "forward"
    BACKWARD = "backward"
    INFERENCE = "inference"

    def label(self, island: bool = False) -> str:
        """The kind as names and logs show it; an island (a piece of a graph compiled between
        ops that run in eager) is ``forward-island``, so a report tells it from a whole graph."""
        return f"{self.value}-island" if island else self.value
