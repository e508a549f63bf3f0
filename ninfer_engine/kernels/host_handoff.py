"""Kernels that hand work to a host thread and take its result back inside a CUDA graph.

The host side is a worker thread spinning on a page-locked control block `ctrl` (int64:
[POSTED, DONE, STOP, 0, jobs...], `cpu_experts.c`), which the kernels reach through unified
addressing; a page-locked staging area carries the inputs one way and `out` the other:

- `stage_pairs`: first, given a `split` (the count of a step's missed pairs to hand the host
  for each count of misses), the first that many pairs read in place (entry -1 - e) have
  their experts' entries set to the host's; then whether any routed pair's table entry
  (`table[id]`) is the host's (`need`, a device flag the other kernels read: a layer with none
  skips the hand-off), and if so the rows `y` and, per pair, its expert id, weight and entry
  copied into staging;
- `post`: then write `POSTED` = (`POSTED`'s sequence + 1) << 16 | job index: one aligned
  8-byte store, so the worker never sees a half-written post, and a later kernel than
  `stage_pairs` (a kernel's stores reach host memory before the next kernel in the stream
  runs, and PCIe keeps the order of posted writes);
- `wait_done`: spin until `DONE` == `POSTED` (the worker writes `out`, then `DONE`), at most
  `polls` reads (~1 µs each over the bus), setting `failed` [1] past that;
- `add_out`: `acc += out`, a kernel after `wait_done`, so it reads the `out` written before
  `DONE`; and, the layer's expert kernels being done, the entries the split set back to
  -1 - e.

`split_misses` is the split's torch form (the CPU reference's inline path, and the kernel's
reference in the tests).

Four kernel launches instead of a CUDA host function: a captured host node cost 73 µs a
layer on the H200 (bench/results/h200-host-contention.json), these a few µs. Under the Triton
interpreter (the CPU tests) they run in order on the calling thread while the worker runs on
its own.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

POSTED, DONE, STOP, JOBS = 0, 1, 2, 4  # `ctrl`'s fields (cpu_experts.c's enum)
SEQ_SHIFT = 16  # POSTED: sequence << 16 | job index (so at most 65536 jobs)
MAX_POLLS = 4_000_000  # ~4 s of reads over the bus before a job counts as lost


@triton.jit
def _stage_kernel(y_ptr, ids_ptr, w_ptr, table_ptr, sx_ptr, sids_ptr, sw_ptr, sent_ptr,
                  need_ptr, split_ptr, split_last, host_entry, n_x, n_pairs,
                  BLOCK: tl.constexpr, PAIRS: tl.constexpr, SPLIT: tl.constexpr):
    o = tl.arange(0, PAIRS)
    m = o < n_pairs
    e = tl.load(ids_ptr + o, mask=m, other=0)
    entry = tl.load(table_ptr + e, mask=m, other=0)
    if SPLIT:  # the first split[misses] pairs read in place go to the host
        miss = (m & (entry < 0)).to(tl.int32)
        take = tl.load(split_ptr + tl.minimum(tl.sum(miss, 0), split_last))
        pick = (miss != 0) & (tl.cumsum(miss, 0) <= take)
        tl.store(table_ptr + e, tl.zeros_like(e) + host_entry, mask=pick)
        tl.debug_barrier()  # (another pair of a picked expert reads the new entry)
        entry = tl.load(table_ptr + e, mask=m, other=0)
    need = tl.sum((m & (entry == host_entry)).to(tl.int32), 0) > 0
    tl.store(need_ptr, need.to(tl.int32))
    if need:  # (a layer none of whose pairs is the host's stages nothing)
        tl.store(sids_ptr + o, e, mask=m)
        tl.store(sw_ptr + o, tl.load(w_ptr + o, mask=m), mask=m)
        tl.store(sent_ptr + o, entry, mask=m)
        for start in range(0, n_x, BLOCK):
            x = start + tl.arange(0, BLOCK)
            tl.store(sx_ptr + x, tl.load(y_ptr + x, mask=x < n_x), mask=x < n_x)


@triton.jit
def _post_kernel(ctrl_ptr, need_ptr, job, SHIFT: tl.constexpr):
    if tl.load(need_ptr) != 0:
        posted = tl.load(ctrl_ptr + 0, volatile=True)
        tl.store(ctrl_ptr + 0, ((posted >> SHIFT) + 1 << SHIFT) | job)


@triton.jit
def _wait_kernel(ctrl_ptr, need_ptr, failed_ptr, polls):
    if tl.load(need_ptr) != 0:
        posted = tl.load(ctrl_ptr + 0, volatile=True)
        done = tl.load(ctrl_ptr + 1, volatile=True)
        n = 0
        while (done != posted) & (n < polls):
            done = tl.load(ctrl_ptr + 1, volatile=True)
            n += 1
        if done != posted:
            tl.store(failed_ptr, 1)


@triton.jit
def _add_kernel(out_ptr, acc_ptr, need_ptr, n, ids_ptr, table_ptr, host_entry, n_pairs,
                BLOCK: tl.constexpr, PAIRS: tl.constexpr):
    if tl.load(need_ptr) != 0:
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = o < n
        acc = tl.load(acc_ptr + o, mask=m)
        tl.store(acc_ptr + o, acc + tl.load(out_ptr + o, mask=m, volatile=True), mask=m)
        if tl.program_id(0) == 0:  # the split's entries back (the layer's kernels are done)
            p = tl.arange(0, PAIRS)
            pm = p < n_pairs
            e = tl.load(ids_ptr + p, mask=pm, other=0)
            entry = tl.load(table_ptr + e, mask=pm, other=0)
            tl.store(table_ptr + e, -1 - e, mask=pm & (entry == host_entry))


def _pairs_block(n: int) -> int:
    return triton.next_power_of_2(max(n, 16))


def stage_pairs(y: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, table: torch.Tensor,
                host_entry: int, stages: tuple[torch.Tensor, ...], need: torch.Tensor,
                split: torch.Tensor | None = None) -> None:
    """With `split` (int32 [S], on the device): `split_misses` first. Then `need` [1] (int32,
    on the device) = whether any pair's `table[id]` is `host_entry`; if so `y` [rows, H],
    `ids` (int64), `weights` (fp32) [rows · k] and `table[ids]` → `stages` (x in y's dtype,
    ids, weights, entries). One program (a decode step's few KB)."""
    n = ids.numel()
    _stage_kernel[(1,)](y, ids, weights, table, *stages, need,
                        need if split is None else split,
                        0 if split is None else split.numel() - 1, host_entry, y.numel(), n,
                        BLOCK=1024, PAIRS=_pairs_block(n), SPLIT=split is not None)


def split_misses(ids: torch.Tensor, table: torch.Tensor, split: torch.Tensor,
                 host_entry: int) -> None:
    """The split in torch: of the pairs `ids` whose `table` entry is < 0 (read in place), the
    first `split[min(misses, len - 1)]` get `host_entry` written to their experts' entries
    (a later pair of such an expert then goes to the host too)."""
    miss = table[ids] < 0
    take = int(split[min(int(miss.sum()), split.numel() - 1)])
    picked = ids[miss][:take]
    table[picked] = host_entry


def post(ctrl: torch.Tensor, need: torch.Tensor, job: int) -> None:
    _post_kernel[(1,)](ctrl, need, job, SHIFT=SEQ_SHIFT)


def wait_done(ctrl: torch.Tensor, need: torch.Tensor, failed: torch.Tensor,
              polls: int = MAX_POLLS) -> None:
    _wait_kernel[(1,)](ctrl, need, failed, polls)


def add_out(out: torch.Tensor, acc: torch.Tensor, need: torch.Tensor, ids: torch.Tensor,
            table: torch.Tensor, host_entry: int) -> None:
    """`acc += out` (both fp32, contiguous, the same size; `out` may be page-locked), and the
    entries of `ids` that are `host_entry` back to -1 - e; where `need` (a layer that handed
    nothing over changed nothing)."""
    n = acc.numel()
    _add_kernel[(triton.cdiv(n, 1024),)](out, acc, need, n, ids, table, host_entry, ids.numel(),
                                         BLOCK=1024, PAIRS=_pairs_block(ids.numel()))
