"""Kernels that hand work to a host thread and take its result back inside a CUDA graph.

The host side is a worker thread spinning on a page-locked control block `ctrl` (int64:
[POSTED, DONE, STOP, 0, jobs...], `cpu_experts.c`), which the kernels reach through unified
addressing; a page-locked staging area carries the inputs one way and `out` the other:

- `stage_pairs`: copy rows `y` and, per routed pair, its expert id, weight and table entry
  (`table[id]`) into staging;
- `post`: then write `POSTED` = (`POSTED`'s sequence + 1) << 16 | job index: one aligned
  8-byte store, so the worker never sees a half-written post, and a later kernel than
  `stage_pairs` (a kernel's stores reach host memory before the next kernel in the stream
  runs, and PCIe keeps the order of posted writes);
- `wait_done`: spin until `DONE` == `POSTED` (the worker writes `out`, then `DONE`), at most
  `polls` reads (~1 µs each over the bus), setting `failed` [1] past that;
- `add_out`: `acc += out`, a kernel after `wait_done`, so it reads the `out` written before
  `DONE`.

Four launches instead of a CUDA host function: a captured host node cost 73 µs a layer on the
H200 (bench/results/h200-host-contention.json), these a few µs. Under the Triton interpreter
(the CPU tests) they run in order on the calling thread while the worker runs on its own.
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
                  n_x, n_pairs, BLOCK: tl.constexpr, PAIRS: tl.constexpr):
    for start in range(0, n_x, BLOCK):
        o = start + tl.arange(0, BLOCK)
        m = o < n_x
        tl.store(sx_ptr + o, tl.load(y_ptr + o, mask=m), mask=m)
    o = tl.arange(0, PAIRS)
    m = o < n_pairs
    e = tl.load(ids_ptr + o, mask=m, other=0)
    tl.store(sids_ptr + o, e, mask=m)
    tl.store(sw_ptr + o, tl.load(w_ptr + o, mask=m), mask=m)
    tl.store(sent_ptr + o, tl.load(table_ptr + e, mask=m), mask=m)


@triton.jit
def _post_kernel(ctrl_ptr, job, SHIFT: tl.constexpr):
    posted = tl.load(ctrl_ptr + 0, volatile=True)
    tl.store(ctrl_ptr + 0, ((posted >> SHIFT) + 1 << SHIFT) | job)


@triton.jit
def _wait_kernel(ctrl_ptr, failed_ptr, polls):
    posted = tl.load(ctrl_ptr + 0, volatile=True)
    done = tl.load(ctrl_ptr + 1, volatile=True)
    n = 0
    while (done != posted) & (n < polls):
        done = tl.load(ctrl_ptr + 1, volatile=True)
        n += 1
    if done != posted:
        tl.store(failed_ptr, 1)


@triton.jit
def _add_kernel(out_ptr, acc_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    acc = tl.load(acc_ptr + o, mask=m)
    tl.store(acc_ptr + o, acc + tl.load(out_ptr + o, mask=m, volatile=True), mask=m)


def stage_pairs(y: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, table: torch.Tensor,
                x_stage: torch.Tensor, ids_stage: torch.Tensor, w_stage: torch.Tensor,
                entry_stage: torch.Tensor) -> None:
    """`y` [rows, H] → `x_stage` (same dtype); `ids` (int64), `weights` (fp32) [rows · k] and
    `table[ids]` → their stages. One program (a decode step's few KB)."""
    n = ids.numel()
    _stage_kernel[(1,)](y, ids, weights, table, x_stage, ids_stage, w_stage, entry_stage,
                        y.numel(), n, BLOCK=1024, PAIRS=triton.next_power_of_2(max(n, 16)))


def post(ctrl: torch.Tensor, job: int) -> None:
    _post_kernel[(1,)](ctrl, job, SHIFT=SEQ_SHIFT)


def wait_done(ctrl: torch.Tensor, failed: torch.Tensor, polls: int = MAX_POLLS) -> None:
    _wait_kernel[(1,)](ctrl, failed, polls)


def add_out(out: torch.Tensor, acc: torch.Tensor) -> None:
    """`acc += out` (both fp32, contiguous, the same size; `out` may be page-locked)."""
    n = acc.numel()
    _add_kernel[(triton.cdiv(n, 1024),)](out, acc, n, BLOCK=1024)
