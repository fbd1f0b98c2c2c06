"""Counting every host <-> device crossing, by reason, where an accelerator would copy.

On CPU a crossing is zero-copy; on TPU/GPU it is a copy over the host link, and for training
and decoding it sets the step time. So every crossing is counted the same way on every device,
in bytes and in number, per graph and in total (``tpu_inductor.report().transfers``):

host -> device
  ``input``        a per-call input the device does not hold (the batch, a host-changed tensor)
  ``resident``     a parameter or buffer imported to stay on the device (once, and again
                   after each change made outside a compiled region)
device -> host
  ``output``       a value handed back to torch (a graph's outputs, gradients)
  ``write-back``   the host copy of an input a graph updated in place (only the changed slice
                   when the update is an ``index_copy_`` or slice assignment)
  ``materialize``  a device-held value copied to the host because something outside a compiled
                   region needs it (saved activations under ``saved_tensors_hooks``)
  ``sync``         the host copy of device-owned state (``keep_on_device``) refreshed because
                   eager code read it: counted in the total only, not per graph
  ``check``        the condition of a ``torch._assert_async`` on values, read by the host
                   callback that checks it (1 byte per assertion per call; total only)

In steady state (a graph's second call onwards) a ``resident`` re-import or a ``materialize``
is unexpected: ``options={"transfers": "log"}`` logs each one, ``"error"`` raises
:class:`~tpu_inductor.core.errors.TransferError` (in the spirit of ``jax.transfer_guard``).
"""

from __future__ import annotations

import dataclasses
import logging

from tpu_inductor.core.errors import TransferError

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.core.transfers"

H2D = "host_to_device"
D2H = "device_to_host"
REASONS = {
    H2D: ("input", "resident"),
    D2H: ("output", "write-back", "materialize", "sync", "check"),
}
UNEXPECTED = frozenset({"resident", "materialize"})

_FIXES = {
    "resident": "it was changed outside a compiled region (an eager optimizer step, an in-place "
    "edit, load_state_dict); compile that code too (e.g. torch.compile(opt.step, backend='tpu'))"
    " or allow it with options={'transfers': 'count'}",
    "materialize": "a saved activation was needed on the host (saved_tensors_hooks are active: "
    "offloading or a hook of yours); remove the hook or allow it with "
    "options={'transfers': 'count'}",
}


@dataclasses.dataclass(kw_only=True)
class Transfers:
    """Cumulative crossings: totals each way and ``by_reason[(direction, reason)] = [count,
    bytes]``. ``str()`` gives one readable line."""

    host_to_device_bytes: int = 0
    host_to_device_count: int = 0
    device_to_host_bytes: int = 0
    device_to_host_count: int = 0
    by_reason: dict = dataclasses.field(default_factory=dict)

    def add(self, direction: str, reason: str, nbytes: int) -> None:
        """Count one crossing of ``nbytes``."""
        if direction == H2D:
            self.host_to_device_bytes += nbytes
            self.host_to_device_count += 1
        else:
            self.device_to_host_bytes += nbytes
            self.device_to_host_count += 1
        slot = self.by_reason.get((direction, reason))
        if slot is None:
            self.by_reason[(direction, reason)] = [1, nbytes]
        else:
            slot[0] += 1
            slot[1] += nbytes

    def bytes(self, direction: str, reason: str | None = None) -> int:
        """Bytes moved one way, for one reason or all of them."""
        if reason is None:
            return self.host_to_device_bytes if direction == H2D else self.device_to_host_bytes
        return self.by_reason.get((direction, reason), [0, 0])[1]

    def count(self, direction: str, reason: str | None = None) -> int:
        """Crossings one way, for one reason or all of them."""
        if reason is None:
            return self.host_to_device_count if direction == H2D else self.device_to_host_count
        return self.by_reason.get((direction, reason), [0, 0])[0]

    def copy(self) -> Transfers:
        """A snapshot (for differences: ``after - before``)."""
        return Transfers(
            host_to_device_bytes=self.host_to_device_bytes,
            host_to_device_count=self.host_to_device_count,
            device_to_host_bytes=self.device_to_host_bytes,
            device_to_host_count=self.device_to_host_count,
            by_reason={k: list(v) for k, v in self.by_reason.items()},
        )

    def __sub__(self, other: Transfers) -> Transfers:
        keys = set(self.by_reason) | set(other.by_reason)
        zero = [0, 0]
        return Transfers(
            host_to_device_bytes=self.host_to_device_bytes - other.host_to_device_bytes,
            host_to_device_count=self.host_to_device_count - other.host_to_device_count,
            device_to_host_bytes=self.device_to_host_bytes - other.device_to_host_bytes,
            device_to_host_count=self.device_to_host_count - other.device_to_host_count,
            by_reason={
                k: [
                    self.by_reason.get(k, zero)[0] - other.by_reason.get(k, zero)[0],
                    self.by_reason.get(k, zero)[1] - other.by_reason.get(k, zero)[1],
                ]
                for k in keys
            },
        )

    def reset(self) -> None:
        """Zero every counter."""
        self.host_to_device_bytes = self.host_to_device_count = 0
        self.device_to_host_bytes = self.device_to_host_count = 0
        self.by_reason.clear()

    def __str__(self) -> str:
        parts = []
        for direction, arrow in ((H2D, "host->device"), (D2H, "device->host")):
            reasons = ", ".join(
                f"{r} {_fmt_bytes(self.bytes(direction, r))} ({self.count(direction, r)})"
                for r in REASONS[direction]
                if self.count(direction, r)
            )
            parts.append(
                f"{arrow} {_fmt_bytes(self.bytes(direction))} in {self.count(direction)}"
                + (f" [{reasons}]" if reasons else "")
            )
        return "; ".join(parts)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


TOTAL = Transfers()


class Counter:
    """One graph's crossings, added to :data:`TOTAL` too, with the ``transfers`` policy.

    ``steady`` becomes true after the graph's first call; from then on a crossing whose reason
    is unexpected (:data:`UNEXPECTED`) is logged (policy ``"log"``) or raised (``"error"``).
    """

    def __init__(self, name: str, policy: str = "count"):
        self.name = name
        self.policy = policy or "count"
        self.totals = Transfers()
        self.steady = False

    def add(self, direction: str, reason: str, nbytes: int, what: str | None = None) -> None:
        """Count a crossing; ``what`` describes the value (built only when needed)."""
        key = (direction, reason)
        for tr in (self.totals, TOTAL):  # Transfers.add, inlined: this runs per tensor per call
            if direction == H2D:
                tr.host_to_device_bytes += nbytes
                tr.host_to_device_count += 1
            else:
                tr.device_to_host_bytes += nbytes
                tr.device_to_host_count += 1
            slot = tr.by_reason.get(key)
            if slot is None:
                tr.by_reason[key] = [1, nbytes]
            else:
                slot[0] += 1
                slot[1] += nbytes
        if self.policy != "count" and self.steady and reason in UNEXPECTED:
            self._unexpected(direction, reason, nbytes, what)
        # INFO: the crossings of each graph's first call; DEBUG: every crossing.
        if log.isEnabledFor(logging.DEBUG if self.steady else logging.INFO):
            arrow = "host->device" if direction == H2D else "device->host"
            where = f" {what}" if what else ""
            log.log(
                logging.DEBUG if self.steady else logging.INFO,
                "%s: %s %s (%s)%s",
                self.name,
                arrow,
                _fmt_bytes(nbytes),
                reason,
                where,
            )

    def _unexpected(self, direction, reason, nbytes, what) -> None:
        arrow = "host->device" if direction == H2D else "device->host"
        message = (
            f"{self.name}: {what or 'a value'} crossed {arrow} in steady state "
            f"({_fmt_bytes(nbytes)}, reason {reason!r}): {_FIXES[reason]}"
        )
        if self.policy == "error":
            raise TransferError(message)
        log.warning("%s", message)
