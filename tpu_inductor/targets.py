"""TPU targets: a named topology to compile for, on a machine that may have no TPU.

libtpu carries XLA's real TPU compiler; ``jax.experimental.topologies`` describes a TPU
topology without owning one (compile-only devices). A :class:`Target` is such a topology plus
the datasheet figures of its chip (:data:`CHIPS`), which the program report
(``programs.py``) measures against. Which device a graph compiles for and whether it runs are
two decisions: a target only changes the first; ``compile_only.py`` makes the second.

Names (:func:`tpu_target`):

- JAX's own form ``"v5e:2x2"``, ``"v4:2x2x1"``, ``"v5p:2x2x2"``, ``"v6e:4x4"``: the chip
  generation and the grid of chips;
- a bare generation ``"v5e"``: one chip;
- Cloud TPU accelerator types ``"v5e-8"``, ``"v5litepod-16"``, ``"v6e-4"``, ``"v4-8"``,
  ``"v5p-16"``: the count is chips for v5e/v6e and TensorCores (two per chip) for v4/v5p.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
from collections.abc import Mapping, Sequence

from tpu_inductor.errors import InvalidOptionError

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip's datasheet figures (per chip, both TensorCores where there are two).

    Attributes:
        generation: ``"v5e"``, ...; ``device_kind``: what JAX calls its devices.
        hbm_bytes: HBM capacity; ``hbm_bytes_per_s``: HBM bandwidth.
        bf16_flops / int8_ops: peak dense matmul rate per second.
        cores: TensorCores per chip (v4 and v5p: two, joined as one "megacore" device).
        source: where the figures come from.
    """

    generation: str
    device_kind: str
    hbm_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float
    int8_ops: float | None
    cores: int
    dims: int  # the topology's grid rank: 2 (v5e, v6e) or 3 (v4, v5p)
    source: str

    def peak_flops(self, dtype: str, precision: str = "default") -> float:
        """Peak matmul FLOP/s for operands of ``dtype`` at XLA ``precision``.

        NOTE: the MXU multiplies bf16; float32 operands are split into bf16 parts, 6 passes at
        ``HIGHEST`` precision (torch's default ``float32_matmul_precision``), 3 at ``HIGH``,
        1 at ``DEFAULT`` (XLA's bf16_6x / bf16_3x algorithms).
        """
        if dtype in ("s8", "u8", "int8", "uint8") and self.int8_ops:
            return self.int8_ops
        if dtype in ("f32", "float32"):
            return self.bf16_flops / {"highest": 6, "high": 3}.get(precision, 1)
        return self.bf16_flops


# Figures per chip from the Cloud TPU system architecture pages, cross-checked against JAX's own
# table (jax/_src/pallas/mosaic/tpu_info.py, jax 0.10.2).
CHIPS: dict[str, Chip] = {
    "v4": Chip(
        "v4", "TPU v4", 32 * GiB, 1.2e12, 275e12, None, 2, 3,
        "https://cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM2 at 1,200 GB/s)",
    ),
    "v5e": Chip(
        "v5e", "TPU v5 lite", 16 * GiB, 819e9, 197e12, 394e12, 1, 2,
        "https://cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 394 TOP/s int8, "
        "16 GiB HBM2 at 819 GB/s)",
    ),
    "v5p": Chip(
        "v5p", "TPU v5", 95 * GiB, 2.765e12, 459e12, 918e12, 2, 3,
        "https://cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, 918 TOP/s int8, "
        "95 GiB HBM2e at 2,765 GB/s)",
    ),
    "v6e": Chip(
        "v6e", "TPU v6 lite", 32 * GiB, 1.64e12, 918e12, 1836e12, 1, 2,
        "https://cloud.google.com/tpu/docs/v6e (918 TFLOP/s bf16, 1,836 TOP/s int8, "
        "32 GiB HBM at 1,640 GB/s)",
    ),
}  # fmt: skip
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "trillium": "v6e"}
_CORE_COUNTED = ("v4", "v5p")  # Cloud accelerator types count TensorCores for these


@dataclasses.dataclass(frozen=True, eq=False)
class Target:
    """A TPU topology to compile for (see :func:`tpu_target`).

    Attributes:
        name: the name as given; ``topology``: JAX's form (``"v5e:2x2"``).
        chip: the chip's datasheet figures.
        devices: the topology's compile-only devices, one per chip.
    """

    name: str
    topology: str
    chip: Chip
    devices: tuple

    @property
    def num_chips(self) -> int:
        """How many chips the topology has."""
        return len(self.devices)

    def mesh(self, axes: Mapping[str, int] | Sequence[str] = ("data",)):
        """A ``jax.sharding.Mesh`` over this topology's chips, for ``options["mesh"]``.

        Args:
            axes: axis names to sizes (``{"data": 2, "model": 2}``; their product must be the
                chip count), or names only: the first takes every chip, the rest size 1.

        Example:
            >>> t = tpu_inductor.tpu_target("v5e:2x2")
            >>> options = {"target": "v5e:2x2", "mesh": t.mesh({"data": 4}), "shardings": "fsdp"}
        """
        import numpy as np
        from jax.sharding import AxisType, Mesh

        if not isinstance(axes, Mapping):
            names = tuple(axes)
            axes = {n: (self.num_chips if i == 0 else 1) for i, n in enumerate(names)}
        sizes = tuple(int(s) for s in axes.values())
        if math.prod(sizes) != self.num_chips:
            raise InvalidOptionError(
                f"mesh axes {dict(axes)} hold {math.prod(sizes)} chips but {self.name} has "
                f"{self.num_chips}; make the sizes multiply to {self.num_chips}"
            )
        devices = np.array(self.devices, dtype=object).reshape(sizes)
        return Mesh(devices, tuple(axes), axis_types=(AxisType.Auto,) * len(sizes))

    def __repr__(self) -> str:
        return f"Target({self.topology!r}, {self.num_chips} x {self.chip.device_kind})"


def tpu_target(name: str) -> Target:
    """The TPU topology ``name``, compile-only: nothing here needs a TPU (only libtpu).

    The same name gives the same :class:`Target` (and the same device objects), so a mesh made
    with :meth:`Target.mesh` matches ``options={"target": name}``.

    Args:
        name: ``"v5e:2x2"`` (JAX's form), ``"v5e"`` (one chip) or a Cloud TPU accelerator type
            (``"v5e-8"``, ``"v5litepod-4"``, ``"v4-8"``, ``"v5p-8"``, ``"v6e-1"``).

    Raises:
        InvalidOptionError: for a name that is not a known generation or grid, or when libtpu
            is missing (``pip install 'tpu-inductor[tpu]'``).

    Example:
        >>> tpu_inductor.tpu_target("v6e-4")
        Target('v6e:2x2', 4 x TPU v6 lite)
    """
    if not isinstance(name, str):
        raise InvalidOptionError(f"a TPU target is a name like 'v5e:2x2', got {name!r}")
    generation, grid = parse_name(name)
    return _target(name, generation, grid)


def parse_name(name: str) -> tuple[str, tuple[int, ...]]:
    """``(generation, chip grid)`` for a target name (see the module docstring).

    Raises:
        InvalidOptionError: naming the accepted forms and generations.
    """
    text = name.strip().lower().replace("tpu ", "").replace("tpu-", "")
    m = re.fullmatch(r"([a-z0-9]+?)(?::(\d+(?:x\d+)*)|-(\d+))?", text)
    gen = _ALIASES.get(m.group(1), m.group(1)) if m else None
    if m is None or gen not in CHIPS:
        raise InvalidOptionError(
            f"unknown TPU target {name!r}. Give a generation and its chip grid as JAX names "
            "it ('v5e:2x2', 'v4:2x2x1', 'v5p:2x2x2', 'v6e:4x4'), a generation alone for one "
            "chip ('v5e'), or a Cloud TPU accelerator type ('v5e-8', 'v5litepod-4', 'v4-8', "
            f"'v6e-16'). Generations: {', '.join(CHIPS)}."
        )
    chip = CHIPS[gen]
    if m.group(2):
        grid = tuple(int(d) for d in m.group(2).split("x"))
        if len(grid) != chip.dims or not all(grid):
            raise InvalidOptionError(
                f"TPU target {name!r}: {gen} chips form a {chip.dims}-D grid, e.g. "
                f"'{gen}:{'x'.join(['2'] * 2 + ['1'] * (chip.dims - 2))}'"
            )
        return gen, grid
    count = int(m.group(3)) if m.group(3) else (chip.cores if gen in _CORE_COUNTED else 1)
    chips = count // chip.cores if gen in _CORE_COUNTED else count
    if chips < 1 or (gen in _CORE_COUNTED and count % chip.cores):
        unit = "TensorCores (2 per chip)" if gen in _CORE_COUNTED else "chips"
        raise InvalidOptionError(f"TPU target {name!r}: the count is {unit}, got {count}")
    return gen, _grid(chips, chip.dims, name)


def _grid(chips: int, dims: int, name: str) -> tuple[int, ...]:
    """The slice shape Cloud TPU gives ``chips`` chips: 2-D grids grow 1x2, 2x2, 2x4, 4x4,
    ...; 3-D ones 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ..."""
    if chips & (chips - 1):
        raise InvalidOptionError(
            f"TPU target {name!r}: {chips} chips is not a slice size (a power of two); "
            "give the grid itself, e.g. 'v5e:2x4'"
        )
    grid = [1] * dims
    steps = [1, 0] if dims == 2 else [0, 1] + [2, 2, 1, 0] + [2, 1, 0] * 8
    for i in range(chips.bit_length() - 1):
        grid[steps[i % 2] if dims == 2 else steps[i]] *= 2
    return tuple(grid)


@functools.cache
def _target(name: str, generation: str, grid: tuple[int, ...]) -> Target:
    topology = f"{generation}:{'x'.join(map(str, grid))}"
    return Target(name, topology, CHIPS[generation], _devices(generation, grid))


# libtpu looks for the TPU it runs on when it first loads; on a machine without one it prints
# three warnings and an error line (accelerator type, worker hostnames) before compiling for a
# topology anyway, and it takes /tmp/libtpu_lockfile, so a second process compiling for a target
# at the same time failed ("Internal error when accessing libtpu multi-process lockfile"). These
# say "no TPU here, a single host, others may load libtpu too" up front (libtpu 0.0.42.1).
_QUIET_LIBTPU = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_ACCELERATOR_TYPE": "v5litepod-4",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


@contextlib.contextmanager
def _no_tpu_here():
    """Quiet libtpu's search for a TPU while a topology is made, when JAX has none: the
    variables are set only while unset, only for the call, and never where JAX has a TPU."""
    import jax

    if any(d.platform == "tpu" for d in jax.devices()):
        yield
        return
    added = {k: v for k, v in _QUIET_LIBTPU.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@functools.cache
def _devices(generation: str, grid: tuple[int, ...]) -> tuple:
    """The compile-only devices of a topology (one per chip; v4/v5p as megacore devices)."""
    import importlib.util

    from jax.experimental import topologies

    if importlib.util.find_spec("libtpu") is None:
        raise InvalidOptionError(
            "compiling for a TPU target needs libtpu (XLA's TPU compiler), which this "
            "environment lacks: pip install 'tpu-inductor[tpu]' (it adds ~700 MB; no TPU needed)"
        )
    kwargs = {"chip_config_name": "megacore" if CHIPS[generation].cores > 1 else "default"}
    # libtpu assumes hosts of 2x2x1 chips; a smaller slice is one host of its own size
    padded = grid + (1,) * (3 - len(grid))
    bounds = [min(g, h) for g, h in zip(padded, (2, 2, 1), strict=True)]
    if bounds != [2, 2, 1]:
        kwargs["chips_per_host_bounds"] = bounds
    topology = f"{generation}:{'x'.join(map(str, grid))}"
    try:
        with _no_tpu_here():
            desc = topologies.get_topology_desc(topology, "tpu", **kwargs)
    except Exception as e:
        text = str(e) or type(e).__name__
        raise InvalidOptionError(
            f"libtpu refused the TPU topology {topology!r}: {text.splitlines()[0]}"
        ) from e
    return tuple(desc.devices)
