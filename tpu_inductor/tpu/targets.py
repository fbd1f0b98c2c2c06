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

import dataclasses
import functools
import math
import re
from collections.abc import Mapping, Sequence

from tpu_inductor.core.devices import quiet_libtpu, start_jax
from tpu_inductor.core.errors import InvalidOptionError

GiB = 1024**3


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chip:
    """One TPU device's datasheet figures: a chip's (both TensorCores where a megacore device
    joins two), or half a chip's where the chip is two devices (TPU7x).

    Attributes:
        generation: ``"v5e"``, ...; ``device_kind``: what JAX calls its devices.
        hbm_bytes: HBM capacity (the datasheet's); ``usable_hbm_bytes``: what libtpu's
            compiler lets a program use (measured: the capacity it states when a program does
            not fit, libtpu 0.0.42.1); ``hbm_bytes_per_s``: HBM bandwidth.
        bf16_flops / int8_ops: peak dense matmul rate per second.
        ici_bytes_per_s: bidirectional inter-chip interconnect (ICI) bandwidth (all links).
        dcn_bytes_per_s: data-center network bandwidth (between slices), ``None`` where the
            cited page gives none.
        cores: TensorCores per device (v4 and v5p: two, joined as one "megacore" device).
        devices_per_chip: JAX devices per chip (TPU7x: 2, one per chiplet).
        source: where the figures come from; ``hbm_source``: where the capacity comes from.
    """

    generation: str
    device_kind: str
    hbm_bytes: int
    usable_hbm_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float
    int8_ops: float | None
    ici_bytes_per_s: float
    dcn_bytes_per_s: float | None
    cores: int
    dims: int  # the topology's grid rank: 2 (v5e, v6e) or 3 (v4, v5p, TPU7x)
    source: str
    devices_per_chip: int = 1
    hbm_source: str = "the datasheet"

    def __post_init__(self):
        if self.usable_hbm_bytes > self.hbm_bytes:
            raise ValueError(
                f"{self.generation}: usable HBM {self.usable_hbm_bytes} above the capacity "
                f"{self.hbm_bytes}"
            )

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


_TPU7X = "https://docs.cloud.google.com/tpu/docs/tpu7x"
# Figures per chip from Google's Cloud TPU pages (the TPU7x page's table compares v5p, v6e and
# TPU7x), cross-checked against JAX's own table (jax/_src/pallas/mosaic/tpu_info.py, jax 0.10.2).
# Usable HBM: libtpu 0.0.42.1's "exceeds available HBM (15.75G)" for a program too big, per
# generation (a 4 GiB broadcast compiled for one device of each; G = GiB).
CHIPS: dict[str, Chip] = {
    "v4": Chip(
        generation="v4",
        device_kind="TPU v4",
        hbm_bytes=32 * GiB,
        usable_hbm_bytes=int(30.75 * GiB),
        hbm_bytes_per_s=1.2e12,
        bf16_flops=275e12,
        int8_ops=None,
        ici_bytes_per_s=300e9,
        dcn_bytes_per_s=None,
        cores=2,
        dims=3,
        source="https://cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM2 at "
        "1,200 GB/s); ICI: 6 links of ~50 GB/s, not on Google's page "
        "(yobitel.com/knowledge-base/tpu-v4)",
    ),
    "v5e": Chip(
        generation="v5e",
        device_kind="TPU v5 lite",
        hbm_bytes=16 * GiB,
        usable_hbm_bytes=int(15.75 * GiB),
        hbm_bytes_per_s=819e9,
        bf16_flops=197e12,
        int8_ops=394e12,
        ici_bytes_per_s=400e9,
        dcn_bytes_per_s=6.4e12 / 8 / 256,
        cores=1,
        dims=2,
        source="https://cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 394 TOP/s int8, 16 GiB "
        "HBM2 at 819 GB/s, ICI 400 GB/s bidirectional, DCN 6.4 Tbps per 256-chip pod)",
    ),
    "v5p": Chip(
        generation="v5p",
        device_kind="TPU v5",
        hbm_bytes=103_000_000_000,
        usable_hbm_bytes=int(95.74 * GiB),
        hbm_bytes_per_s=2.765e12,
        bf16_flops=459e12,
        int8_ops=918e12,
        ici_bytes_per_s=1200e9,
        dcn_bytes_per_s=50e9 / 8,
        cores=2,
        dims=3,
        source=f"{_TPU7X} (v5p column: 459 TFLOP/s bf16, 95 GiB HBM at 2,765 GB/s, ICI 1,200 "
        "GB/s bidirectional, DCN 50 Gb/s per chip); 918 TOP/s int8: "
        "https://cloud.google.com/tpu/docs/v5p",
        hbm_source="10^11 x 1.03 bytes in JAX's TPU table (jax/_src/pallas/mosaic/tpu_info.py); "
        "the datasheet's 95 GiB is below what libtpu lets a program use",
    ),
    "v6e": Chip(
        generation="v6e",
        device_kind="TPU v6 lite",
        hbm_bytes=32 * GiB,
        usable_hbm_bytes=int(31.25 * GiB),
        hbm_bytes_per_s=1.638e12,
        bf16_flops=918e12,
        int8_ops=1836e12,
        ici_bytes_per_s=800e9,
        dcn_bytes_per_s=100e9 / 8,
        cores=1,
        dims=2,
        source=f"{_TPU7X} (v6e column: 918 TFLOP/s bf16, 32 GiB HBM at 1,638 GB/s, ICI 800 GB/s "
        "bidirectional, DCN 100 Gb/s per chip); 1,836 TOP/s int8: "
        "https://cloud.google.com/tpu/docs/v6e",
    ),
    # two devices per chip (one per chiplet, as JAX and libtpu expose them): per-device figures
    # are half the chip's
    "tpu7x": Chip(
        generation="tpu7x",
        device_kind="TPU7x",
        hbm_bytes=96 * GiB,
        usable_hbm_bytes=int(94.75 * GiB),
        hbm_bytes_per_s=7.38e12 / 2,
        bf16_flops=2307e12 / 2,
        int8_ops=None,
        ici_bytes_per_s=1200e9 / 2,
        dcn_bytes_per_s=100e9 / 8 / 2,
        cores=1,
        dims=3,
        source=f"{_TPU7X} (per chip: 2,307 TFLOP/s bf16, 4,614 fp8, 192 GiB HBM at 7,380 GB/s, "
        "ICI 1,200 GB/s bidirectional, DCN 100 Gb/s; two devices per chip, each given half)",
        devices_per_chip=2,
    ),
}
_ALIASES = {
    "v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "trillium": "v6e",
    "v7": "tpu7x", "7x": "tpu7x", "v7x": "tpu7x", "ironwood": "tpu7x",
}  # fmt: skip
_CORE_COUNTED = ("v4", "v5p", "tpu7x")  # Cloud accelerator types count TensorCores for these


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Target:
    """A TPU topology to compile for (see :func:`tpu_target`).

    Attributes:
        name: the name as given; ``topology``: JAX's form (``"v5e:2x2"``; ``"v5e:2x2 x2
            slices"`` for several slices).
        chip: the figures of one device (a chip, or half of a TPU7x chip).
        devices: the topology's compile-only devices, one per chip (two per TPU7x chip),
            slice by slice.
        slices: how many slices (joined by the data-center network, DCN).
    """

    name: str
    topology: str
    chip: Chip
    devices: tuple
    slices: int = 1

    @property
    def num_devices(self) -> int:
        """How many JAX devices the topology has (a mesh is over these)."""
        return len(self.devices)

    @property
    def num_chips(self) -> int:
        """How many chips the topology has."""
        return len(self.devices) // self.chip.devices_per_chip

    def slice_of(self, device_id: int) -> int:
        """Which slice the device with this id is in (0 for a single slice)."""
        for d in self.devices:
            if d.id == device_id:
                return int(getattr(d, "slice_index", 0) or 0)
        return 0

    def mesh(self, axes: Mapping[str, int] | Sequence[str] = ("data",)):
        """A ``jax.sharding.Mesh`` over this topology's devices, for ``options["mesh"]``.

        Args:
            axes: axis names to sizes (``{"data": 2, "model": 2}``; their product must be the
                device count), or names only: the first takes every device, the rest size 1.

        Example:
            >>> t = tpu_inductor.tpu_target("v5e:2x2")
            >>> options = {"target": "v5e:2x2", "mesh": t.mesh({"data": 4}), "shardings": "fsdp"}
        """
        import numpy as np
        from jax.sharding import AxisType, Mesh

        n = self.num_devices
        if not isinstance(axes, Mapping):
            names = tuple(axes)
            axes = {a: (n if i == 0 else 1) for i, a in enumerate(names)}
        sizes = tuple(int(s) for s in axes.values())
        if math.prod(sizes) != n:
            raise InvalidOptionError(
                f"mesh axes {dict(axes)} hold {math.prod(sizes)} devices but {self.name} has "
                f"{n}; make the sizes multiply to {n}"
            )
        devices = np.array(self.devices, dtype=object).reshape(sizes)
        return Mesh(devices, tuple(axes), axis_types=(AxisType.Auto,) * len(sizes))

    def __repr__(self) -> str:
        per = f", {self.num_devices} devices" if self.chip.devices_per_chip > 1 else ""
        return f"Target({self.topology!r}, {self.num_chips} x {self.chip.device_kind}{per})"


_SLICES = re.compile(r"\s*(?:x|\*)\s*(\d+)\s*slices?$")


def tpu_target(name: str, slices: int | None = None) -> Target:
    """The TPU topology ``name``, compile-only: nothing here needs a TPU (only libtpu).

    The same name gives the same :class:`Target` (and the same device objects), so a mesh made
    with :meth:`Target.mesh` matches ``options={"target": name}``.

    Args:
        name: ``"v5e:2x2"`` (JAX's form), ``"v5e"`` (one chip), a Cloud TPU accelerator type
            (``"v5e-8"``, ``"v5litepod-4"``, ``"v4-8"``, ``"v5p-8"``, ``"v6e-1"``,
            ``"tpu7x-8"``), each optionally followed by ``"x2slices"`` for several slices
            joined by the data-center network (``"v5e:2x2x2slices"``).
        slices: the number of slices, instead of the name's suffix.

    Raises:
        InvalidOptionError: for a name that is not a known generation or grid, or when libtpu
            is missing (``pip install 'tpu-inductor[tpu]'``).

    Example:
        >>> tpu_inductor.tpu_target("v6e-4")
        Target('v6e:2x2', 4 x TPU v6 lite)
    """
    if not isinstance(name, str):
        raise InvalidOptionError(f"a TPU target is a name like 'v5e:2x2', got {name!r}")
    base, named_slices = split_slices(name)
    if slices is not None and named_slices not in (1, slices):
        raise InvalidOptionError(f"TPU target {name!r} names {named_slices} slices, not {slices}")
    generation, grid = parse_name(base)
    return _target(name, generation, grid, slices or named_slices)


def split_slices(name: str) -> tuple[str, int]:
    """``("v5e:2x2", 2)`` for ``"v5e:2x2x2slices"``; ``(name, 1)`` without the suffix."""
    m = _SLICES.search(name.strip().lower())
    if m is None:
        return name, 1
    count = int(m.group(1))
    if count < 1:
        raise InvalidOptionError(f"TPU target {name!r}: at least one slice")
    return name.strip()[: m.start()], count


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
    cores = chip.cores * chip.devices_per_chip  # TensorCores per chip
    count = int(m.group(3)) if m.group(3) else (cores if gen in _CORE_COUNTED else 1)
    chips = count // cores if gen in _CORE_COUNTED else count
    if chips < 1 or (gen in _CORE_COUNTED and count % cores):
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
def _target(name: str, generation: str, grid: tuple[int, ...], slices: int = 1) -> Target:
    topology = f"{generation}:{'x'.join(map(str, grid))}"
    if slices > 1:
        topology += f" x{slices} slices"
    devices = _devices(generation, grid, slices)
    return Target(
        name=name, topology=topology, chip=CHIPS[generation], devices=devices, slices=slices
    )


@functools.cache
def _devices(generation: str, grid: tuple[int, ...], slices: int = 1) -> tuple:
    """The compile-only devices of a topology (one per chip; v4/v5p as megacore devices; two
    per TPU7x chip), ``slices`` copies of it (libtpu's ``num_slices``)."""
    import importlib.util

    from jax.experimental import topologies

    if importlib.util.find_spec("libtpu") is None:
        raise InvalidOptionError(
            "compiling for a TPU target needs libtpu (XLA's TPU compiler), which this "
            "environment lacks: pip install 'tpu-inductor[tpu]' (it adds ~700 MB; no TPU needed)"
        )
    kwargs = {"chip_config_name": "megacore" if CHIPS[generation].cores > 1 else "default"}
    if slices > 1:
        kwargs["num_slices"] = slices
    # libtpu assumes hosts of 2x2x1 chips; a smaller slice is one host of its own size
    padded = grid + (1,) * (3 - len(grid))
    bounds = [min(g, h) for g, h in zip(padded, (2, 2, 1), strict=True)]
    if bounds != [2, 2, 1]:
        kwargs["chips_per_host_bounds"] = bounds
    topology = f"{generation}:{'x'.join(map(str, grid))}"
    try:
        start_jax()  # libtpu loads once, quietly where no TPU is attached
        with quiet_libtpu():
            desc = topologies.get_topology_desc(topology, "tpu", **kwargs)
    except Exception as e:
        text = str(e) or type(e).__name__
        raise InvalidOptionError(
            f"libtpu refused the TPU topology {topology!r}: {text.splitlines()[0]}"
        ) from e
    return tuple(desc.devices)
