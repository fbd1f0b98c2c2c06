"""``GraphKind``: AOTAutograd's three graph kinds, shown and stored as their plain names."""

from __future__ import annotations

import json

from tpu_inductor.core.graph_kind import GraphKind


def test_a_kind_prints_compares_and_serializes_as_its_name():
    assert [str(k) for k in GraphKind] == ["forward", "backward", "inference"]
    assert GraphKind.FORWARD == "forward" and f"{GraphKind.BACKWARD}" == "backward"
    assert json.loads(json.dumps({GraphKind.INFERENCE: 1})) == {"inference": 1}
    assert GraphKind("backward") is GraphKind.BACKWARD


def test_an_island_is_labelled_as_one():
    assert GraphKind.FORWARD.label() == "forward"
    assert GraphKind.INFERENCE.label(island=True) == "inference-island"
