"""``largest_batch``'s search (tpu_inductor/training/planning.py), on made-up probes: the largest
size that fits, in about four probes when the peak grows as a line with the size. The compiles
themselves are in tests/tpu/test_planning.py."""

from __future__ import annotations

import pytest

from tpu_inductor.training.planning import Probe, _largest_fitting

HBM = 100 * 2**20


def _probe(size: int, fits: bool, peak_bytes: int) -> Probe:
    """A probe with only what the search reads."""
    return Probe(
        size=size,
        fits=fits,
        peak_bytes=peak_bytes,
        roofline_seconds=0.0,
        mfu_ceiling=None,
        seconds=0.0,
    )


def _probes(base: float, per: float, curve: float = 0.0, unit: int = 1):
    asked = []

    def probe(n: int) -> Probe:
        asked.append(n)
        k = n / unit
        peak = int((base + per * k + curve * k * k) * 2**20)
        return _probe(n, peak <= HBM, peak)

    return probe, asked


def _truth(base, per, curve, unit, top=1 << 16):
    best, n = None, unit
    while n <= top and base + per * (n / unit) + curve * (n / unit) ** 2 <= 100:
        best, n = n, n + unit
    return best


@pytest.mark.parametrize(
    "base, per, curve, unit",
    [(10, 3.1, 0, 1), (40, 0.7, 0.001, 8), (5, 9.5, 0.02, 4), (90, 4, 0, 1), (1, 0.05, 0, 2)],
)
def test_the_boundary_is_found_in_about_four_probes(base, per, curve, unit):
    probe, asked = _probes(base, per, curve, unit)
    assert _largest_fitting(probe, unit, 1 << 16, HBM) == _truth(base, per, curve, unit)
    # a line: two probes, the predicted boundary and the size above it (one more where the
    # peaks round the line off by a size); a curve: two more
    assert len(asked) <= (5 if curve == 0 else 6), asked


def test_nothing_fits_and_everything_fits():
    probe, asked = _probes(120, 1)
    assert _largest_fitting(probe, 1, 1 << 16, HBM) is None and asked == [1]
    probe, _ = _probes(0, 1e-3)
    assert _largest_fitting(probe, 1, 512, HBM) == 512


def test_a_refused_compile_counts_as_not_fitting():
    def probe(n):  # the compiler refuses from 7 on (no peak): the search still converges
        return _probe(n, n < 7, 0 if n >= 7 else n * 2**20)

    assert _largest_fitting(probe, 1, 1 << 16, HBM) == 6
