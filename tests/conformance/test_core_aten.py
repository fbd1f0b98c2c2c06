"""Every Core ATen overload is lowered, decomposed, or listed as unsupported with a reason.

Core ATen is the opset AOTAutograd decomposes to (schemas tagged ``torch.Tag.core``; 193
overloads in torch 2.13). An overload is accounted for when:

- it has a lowering (``tpu_inductor.lowering.lowerings.LOWERINGS``);
- ``tpu_inductor.capture.aot.decomposition_table()`` decomposes it;
- it is CompositeImplicitAutograd: tracing always decomposes it, so no backend receives it;
- it is an ``out=`` overload and a functional overload of the same op is accounted for
  (functionalization replaces one with the other);
- ``tpu_inductor.lowering.lowerings.unsupported.UNSUPPORTED`` gives the reason it is not supported.

``KNOWN_MISSING`` lists the overloads that are none of these yet; each is an expected failure
(strict: when one gets covered, the test says to delete its row).
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from core_aten import core_aten_overloads, coverage  # tests/conformance is on sys.path
from torch._ops import OpOverload

from tpu_inductor.core.errors import UnsupportedOpError
from tpu_inductor.lowering.lower import check_supported
from tpu_inductor.lowering.lowerings import LOWERINGS
from tpu_inductor.lowering.lowerings.unsupported import UNSUPPORTED

aten = torch.ops.aten

# Core ATen overloads with no lowering, decomposition or UNSUPPORTED row yet. Delete a row when
# the overload gets covered (the test fails until you do).
KNOWN_MISSING: dict[str, str] = {}


CORE = core_aten_overloads()


def test_core_aten_count():
    """torch 2.13 tags 193 Core ATen overloads; a different count means a new torch to review."""
    if torch.__version__.startswith("2.13"):
        assert len(CORE) == 193, [str(op) for op in CORE]
    else:
        assert len(CORE) > 150


def test_report_missing_core_ops(capsys):
    """Print every Core ATen overload that is neither lowered, decomposed nor unsupported."""
    missing = [str(op) for op in CORE if coverage(op) is None]
    with capsys.disabled():
        print(f"\nCore ATen: {len(CORE) - len(missing)}/{len(CORE)} accounted for; missing:")
        for name in missing:
            print(f"  {name}")
    assert set(missing) == set(KNOWN_MISSING), (
        f"newly missing: {sorted(set(missing) - set(KNOWN_MISSING))}; "
        f"covered now, delete from KNOWN_MISSING: {sorted(set(KNOWN_MISSING) - set(missing))}"
    )


@pytest.mark.parametrize("op", CORE, ids=str)
def test_core_op_is_accounted_for(op):
    """One Core ATen overload has a lowering, a decomposition or an UNSUPPORTED row."""
    if str(op) in KNOWN_MISSING:
        if coverage(op) is not None:
            pytest.fail(f"{op} is covered now ({coverage(op)}): delete it from KNOWN_MISSING")
        pytest.xfail(KNOWN_MISSING[str(op)])
    assert coverage(op) is not None, f"{op} has no lowering, decomposition or UNSUPPORTED row"


def test_unsupported_rows_are_not_lowered():
    """An op with a lowering must not also be listed as unsupported."""
    both = [str(op) for op in UNSUPPORTED if op in LOWERINGS]
    assert not both, (
        f"lowered now, delete from tpu_inductor/lowering/lowerings/unsupported.py: {both}"
    )


def test_unsupported_reasons_say_what_to_do():
    """Every UNSUPPORTED row explains why and what to do instead."""
    for op, reason in UNSUPPORTED.items():
        assert isinstance(op, OpOverload), op
        assert "What to do:" in reason, op


def test_unsupported_op_error_quotes_the_reason():
    """check_supported puts an UNSUPPORTED row's reason next to the offending node."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(3)
    graph.output((graph.call_function(aten.nonzero.default, (x,)),))
    with pytest.raises(UnsupportedOpError) as info:
        check_supported(fx.GraphModule(torch.nn.Module(), graph))
    message = str(info.value)
    assert "aten.nonzero.default(float32[3])" in message
    assert UNSUPPORTED[aten.nonzero.default] in message
    assert "capture_dynamic_output_shape_ops" in message
