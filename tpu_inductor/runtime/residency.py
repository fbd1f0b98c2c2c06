"""What stays on the device between calls, and when a host tensor may use its device copy.

One versioned table, :data:`VALUES`, maps a host tensor to the ``jax.Array`` that holds the
same values on the device. Every graph consults it for every tensor input, so a value crosses
at most once while it is unchanged:

- parameters and buffers are recorded when first imported;
- every tensor a compiled graph returns is recorded with the array it came from, so handing it
  to a later graph (gradients into ``opt.step``, hidden states into a second compiled module)
  sends nothing;
- an input a graph updates in place (BatchNorm statistics, optimizer state, a static KV cache)
  is recorded with its new device value after the host write-back.

An entry is keyed by the tensor's data pointer and is valid only while (1) the storage it was
recorded for is alive (a weak reference to the object that owns it: the tensor, or for an
output the numpy array its storage holds), (2) the tensor's version counter is the one
recorded (any in-place change bumps it; views and ``detach()`` share it, so ``p.grad``, which
autograd stores detached, still matches) and (3) shape, strides and dtype are the recorded
ones. Edits through ``.data`` bypass version counters (torch's own autograd can't see them
either) and so are not seen: change tensors in place under ``torch.no_grad()`` instead.

Saved activations (forward outputs that AOTAutograd keeps for backward) never leave the
device: the forward hands autograd a one-element placeholder carrying its array
(:func:`saved_handle`), and the backward takes the array back (:func:`saved_value`).
"""

from __future__ import annotations

import weakref

import jax
import torch

from tpu_inductor.core.boundary import nbytes
from tpu_inductor.runtime.sharding import resident_bytes_per_device

_SAVED = "_tpu_inductor_saved"


class StackSlice:
    """Layer ``index`` of a stacked device array: the device value of one member of stacked
    state (``lowering/packing.py``), which becomes an array of its own only when something
    reads that member alone (:meth:`array`: one slice on the device). The stack itself is what
    the next call of the graph that made it takes (:meth:`DeviceValues.stack_of`)."""

    __slots__ = ("stack", "index", "_array")

    def __init__(self, stack: jax.Array, index: int):
        self.stack = stack
        self.index = index
        self._array = None

    def array(self) -> jax.Array | None:
        """This member as a ``jax.Array`` (``None`` when the stack was donated meanwhile)."""
        if self._array is None:
            if self.stack.is_deleted():
                return None
            with jax.enable_x64(True):
                self._array = jax.lax.index_in_dim(self.stack, self.index, keepdims=False)
        return self._array

    @property
    def nbytes(self) -> int:
        return self.stack.nbytes // self.stack.shape[0]


def held(arr):
    """The device array an entry keeps alive (a :class:`StackSlice`'s stack)."""
    return arr.stack if isinstance(arr, StackSlice) else arr


class DeviceValues:
    """Host tensor -> its current value on the device (see the module docstring)."""

    def __init__(self):
        # No lock: weak-reference callbacks run in whichever thread drops the last reference,
        # possibly inside another method of this table, so one would deadlock; each method is
        # a single dict operation under the GIL.
        self._entries: dict[int, tuple] = {}

    def lookup(self, t: torch.Tensor, bumped: bool = False) -> jax.Array | None:
        """The device copy of ``t`` if it is current, else ``None``.

        ``bumped``: AOTAutograd raised ``t``'s version by one just before this call (an input
        the graph mutates in place), so the entry recorded one version lower is current.
        """
        arr = self._current(t, bumped)
        if isinstance(arr, StackSlice):
            arr = arr.array()
        return arr

    def _current(self, t: torch.Tensor, bumped: bool = False):
        """The recorded value of ``t`` if current: an array or a :class:`StackSlice`."""
        e = self._entries.get(t.data_ptr())
        if e is None:
            return None
        ref, version, shape, stride, dtype, arr = e
        if version != (t._version - 1 if bumped else t._version):
            return None
        owner = ref()
        if owner is t:  # the recorded tensor itself: any resize or restride bumped its version
            return arr
        if owner is None or shape != t.shape or dtype != t.dtype or stride != t.stride():
            return None
        return arr

    def stack_of(self, tensors, bumped) -> jax.Array | None:
        """The stacked array whose layers are the current values of ``tensors`` in order (what
        a stacked graph returned for them), or ``None``; ``bumped``: per tensor, as in
        :meth:`lookup`."""
        stack = None
        for k, (t, b) in enumerate(zip(tensors, bumped, strict=True)):
            arr = self._current(t, b)
            if not isinstance(arr, StackSlice) or arr.index != k:
                return None
            if stack is None:
                stack = arr.stack
            elif arr.stack is not stack:
                return None
        if stack is None or stack.shape[0] != len(tensors) or stack.is_deleted():
            return None
        return stack

    def owner(self, t: torch.Tensor):
        """The object whose life the device copy of ``t`` is tied to (see :meth:`record`), if
        the table holds a current one; else ``None``."""
        if self.lookup(t) is None:
            return None
        return self._entries[t.data_ptr()][0]()

    def record(self, t: torch.Tensor, arr, owner=None) -> None:
        """``arr`` (an array or a :class:`StackSlice`) is now ``t``'s value on the device, until
        ``t`` changes or ``owner`` (the object whose life keeps ``t``'s storage alive; ``t``
        itself by default) dies."""
        if t.numel() == 0:
            return
        ptr = t.data_ptr()
        ref = weakref.ref(t if owner is None else owner, lambda r, ptr=ptr: self._drop(ptr, r))
        self._entries[ptr] = (ref, t._version, t.shape, t.stride(), t.dtype, arr)

    def _drop(self, ptr: int, ref) -> None:
        e = self._entries.get(ptr)
        if e is not None and e[0] is ref:
            self._entries.pop(ptr, None)

    def __len__(self) -> int:
        return len(self._entries)

    def device_bytes(self) -> int:
        """Bytes of device arrays the table keeps alive."""
        seen = {id(held(e[5])): held(e[5]) for e in list(self._entries.values())}
        return sum(nbytes(a) for a in seen.values())

    def bytes_per_device(self) -> dict[str, int]:
        """Device -> bytes of the arrays the table keeps alive there (a sharded array's shards
        counted on their own devices, a replicated one on each)."""
        seen = {id(held(e[5])): held(e[5]) for e in list(self._entries.values())}
        return resident_bytes_per_device(seen.values())

    def clear(self) -> None:
        """Forget every device copy (the next use of each tensor crosses again)."""
        self._entries = {}

    def forget_copies(self, keep: set[int]) -> int:
        """Forget every device copy whose array is not in ``keep`` (ids of arrays that are the
        only current value, such as keep_on_device's pending ones); the host tensors are
        current, so the next use of each crosses again (``resident``). Returns how many."""
        drop = [p for p, e in list(self._entries.items()) if id(e[5]) not in keep]
        for ptr in drop:
            self._entries.pop(ptr, None)
        return len(drop)


VALUES = DeviceValues()


def saved_handle(arr: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """A placeholder autograd can save in place of ``arr``: right shape and dtype, one element
    of storage (every stride 0), carrying the array. Its values are not ``arr``'s."""
    h = torch.empty_strided(tuple(arr.shape), (0,) * arr.ndim, dtype=dtype)
    setattr(h, _SAVED, arr)
    return h


def saved_value(t) -> jax.Array | None:
    """The device array behind a :func:`saved_handle`, or ``None`` for any other tensor."""
    return getattr(t, _SAVED, None)


def saved_tensors_hooks_active() -> bool:
    """Whether ``torch.autograd.graph.saved_tensors_hooks`` are active: then saved tensors go
    through the user's pack hook and must be real host tensors."""
    return bool(torch._C._autograd._top_saved_tensors_default_hooks(True))


def device_zeros(shape: tuple, dtype, device, cache: dict) -> jax.Array:
    """An all-zeros array on ``device`` (stands in for a tangent autograd filled with zeros, so
    the zeros are not sent), cached in ``cache``: the calling graph's own dict, so the zeros die
    with the graph (a module-level cache kept logits- and attention-shaped zeros alive after
    their models were deleted and Dynamo reset: tests/runtime/test_live_arrays.py)."""
    key = (tuple(shape), dtype, device)
    z = cache.get(key)
    if z is None:
        z = jax.device_put(jax.numpy.zeros(shape, dtype), device)
        if len(cache) > 64:
            cache.clear()
        cache[key] = z
    return z


# A tangent smaller than this is sent as it is: checking whether it is all zeros would cost
# more than sending it.
ZERO_CHECK_BYTES = 4096


def is_all_zeros(t: torch.Tensor) -> bool:
    """Whether a (host) tangent is all zeros, as autograd materializes for an output nobody
    differentiated. O(1) for almost every real gradient (its first element is nonzero)."""
    if t.numel() * t.element_size() < ZERO_CHECK_BYTES or t.is_complex():
        return False
    flat = t.reshape(-1)
    if flat[0].item() != 0:
        return False
    return not bool(flat.any())
