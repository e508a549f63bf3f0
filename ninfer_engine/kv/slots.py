"""Recurrent-state slots (model-math.md §4, http-contract §4).

`StatePool` holds the recurrent (GDN conv + SSM) states of the hybrid family as rows of one
device tensor per (layer, field): running sequences hold one slot each, and so does every
prefix-tree snapshot (a pool of its own, `kv.radix`). A slot is an index; the decode step and
the CUDA prompt kernels address the rows by index (vLLM's `state_indices`, SGLang's
`MambaPool`), the torch reference forward reads and writes the slot's row views in place, so
no state is copied into batch rows or back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

# per recurrent layer, its state fields: name -> (shape of one slot's row, dtype)
StateLayout = list[dict[str, tuple[tuple[int, ...], torch.dtype]]]


@dataclass(eq=False)
class StateSlot:
    """Row `index` of a `StatePool`: `layers[l]` is layer l's state over views of that row."""

    index: int
    layers: list[Any]
    pool: Any = None  # the `StatePool` it is a row of

    def tensors(self) -> list[torch.Tensor]:
        return [v for layer in self.layers for v in vars(layer).values()
                if isinstance(v, torch.Tensor)]


class StatePool:
    """`total` state slots laid out by `layout` on `device`; `view(**fields)` builds one layer's
    state object over a slot's rows (e.g. `GDNState`). Slots are zeroed when acquired, unless
    the caller overwrites them."""

    def __init__(self, total: int, layout: StateLayout, device: torch.device | str,
                 view: Callable[..., Any], pinned: bool = False) -> None:
        self.total = total

        def zeros(*shape, dtype):  # (`pinned`: page-locked host memory, the host tier's)
            return torch.zeros(*shape, dtype=dtype, device=device, pin_memory=pinned)
        # a field alike in every layer is one [layers, total, ...] tensor, each layer's a view
        # of it: a step can then address every layer's rows of a slot at once (`stack`)
        self._stacks = {name: zeros(len(layout), total, *shape, dtype=dtype)
                        for name, (shape, dtype) in (layout[0].items() if layout else ())
                        if all(layer.get(name) == (shape, dtype) for layer in layout)}
        self.fields = [{name: self._stacks[name][i] if name in self._stacks
                        else zeros(total, *shape, dtype=dtype)
                        for name, (shape, dtype) in layer.items()}
                       for i, layer in enumerate(layout)]
        self._layout = (layout, torch.device(device))  # what `copy_state` matches pools by
        self._view = view
        self._free = list(range(total - 1, -1, -1))  # pop() hands out slot 0 first
        # records the copies for tensor-parallel followers (`parallel.mirror`); None: off
        self.recorder: Any = None

    @property
    def free(self) -> int:
        return len(self._free)

    def field(self, name: str) -> list[torch.Tensor]:
        """The `[total, ...]` tensor of field `name`, one per layer: what the step indexes."""
        return [layer[name] for layer in self.fields]

    def stack(self, name: str) -> torch.Tensor | None:
        """Field `name` of every layer as one `[layers, total, ...]` tensor (the `field`
        tensors are its views), or None where the layers' shapes differ."""
        return self._stacks.get(name)

    def slot(self, index: int) -> StateSlot:
        """Slot `index` as a `StateSlot` (views; no ownership check). Each layer's state also
        names its pool tensors and row (`pool`, `slot`), for kernels that index them."""
        return StateSlot(index, [self._view(**{n: t[index] for n, t in layer.items()},
                                            pool=layer, slot=index)
                                 for layer in self.fields], self)

    def acquire(self, zeroed: bool = True) -> StateSlot | None:
        """A free slot, zeroed unless the caller overwrites all of it (`copy_state` into a
        snapshot: zeroing a host slot was a ~12 MB memset on the CPU per 35B-A3B snapshot)."""
        if not self._free:
            return None
        slot = self.slot(self._free.pop())
        if zeroed:
            self.zero(slot.index)
        return slot

    def zero(self, index: int) -> None:
        """Zero slot `index`: one launch a stacked field (every layer's row), not one a
        tensor (the fields' mixed dtypes sent `_foreach_zero_` down its per-tensor path: 12
        launches a 35B-A3B slot of 8 layers, before the first kernel of a burst's prompt
        step)."""
        for row in self._rows(index):
            row.zero_()

    def _rows(self, index: int) -> list[torch.Tensor]:
        """Slot `index`'s rows: each stacked field's across every layer, then each other
        field's (one order for every pool of one layout)."""
        return [stack[:, index] for stack in self._stacks.values()] + [
            t[index] for layer in self.fields for name, t in layer.items()
            if name not in self._stacks]

    def release(self, slot: StateSlot) -> None:
        self._free.append(slot.index)

    def host_copy(self, total: int, pinned: bool) -> StatePool:
        """A pool of `total` slots with this one's layout in host memory (page-locked when
        `pinned`): the host state tier (`kv.host_tier`)."""
        layout = [{name: (tuple(t.shape[1:]), t.dtype) for name, t in layer.items()}
                  for layer in self.fields]
        return StatePool(total, layout, "cpu", self._view, pinned)


def copy_state(src: StateSlot, dst: StateSlot) -> None:
    """Overwrite `dst`'s rows with `src`'s: between two pools of one layout on one device, one
    copy a stacked field (the GDN fields' mixed dtypes sent `_foreach_copy_` down its
    per-tensor path: 60 launches a 40-layer 35B-A3B snapshot, each finished request's
    checkpoint); else one multi-tensor copy on one device; across host and device, copies
    queued on the current stream (the step after them reads in order)."""
    recorder = getattr(dst.pool, "recorder", None)
    if recorder is not None:
        recorder.copy_state(src, dst)
    a, b = src.pool, dst.pool
    if isinstance(a, StatePool) and isinstance(b, StatePool) and a._layout == b._layout:
        for to, of in zip(b._rows(dst.index), a._rows(src.index)):  # as `StatePool.zero`
            to.copy_(of)
        return
    dst_tensors, src_tensors = dst.tensors(), src.tensors()
    if dst_tensors and dst_tensors[0].device == src_tensors[0].device:
        torch._foreach_copy_(dst_tensors, src_tensors)
        return
    for to, of in zip(dst_tensors, src_tensors):
        to.copy_(of, non_blocking=True)
