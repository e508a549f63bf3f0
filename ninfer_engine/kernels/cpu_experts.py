"""Routed experts on the host's cores from their stored fp8-row form (`cpu_experts.c`).

`fp8_experts(x, rows, experts, weights, gate_up, down, out)` adds, for each pair i,
`weights[i] · down_e(silu(gate_e x[rows[i]]) · up_e x[rows[i]])` with e = `experts[i]` to
`out[rows[i]]`, in fp32, reading the e4m3 codes and bf16 row scales of the stacks where they
are (an offloaded layer's page-locked host store: no decoded copy of an expert is made). Built
by the system C compiler on first use like the CPU decode step (`cpu_decode.build_library`);
`cpu_experts_unavailable()` says why it cannot run here. `start_worker` runs the same sum over
a step's staged routing on a thread the GPU posts jobs to (`experts.host_jobs`).
`fp8_experts_ref` is its float64 reference.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from .cpu_decode import FLAGS, build_library, unavailable

SOURCE = Path(__file__).with_name("cpu_experts.c")
HEADERS = tuple(Path(__file__).with_name(f"cpu_experts_{part}.h") for part in ("bf16", "team"))
ISAS = ("avx2", "avx512", "avx512-bf16")  # the kernel's forms, narrowest first


@functools.cache
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_library(SOURCE, (SOURCE, *HEADERS), FLAGS,
                                        "the CPU expert kernel")))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.ninfer_fp8_experts.argtypes = [p, i64, i64, i64, p, p, p, p, p, p, p, p, p, i64]
    lib.ninfer_fp8_experts.restype = None
    lib.ninfer_cpu_moe_job.argtypes = [p]
    lib.ninfer_cpu_moe_job.restype = None
    lib.ninfer_moe_job_size.restype = i64
    lib.ninfer_fp8_experts_bf16.argtypes = [p, i64, i64, i64, i64, p, p, p, p, p, p, p, p, p,
                                            p, i64]
    lib.ninfer_fp8_experts_bf16.restype = None
    lib.ninfer_experts_isa.argtypes = [i64]
    lib.ninfer_experts_isa.restype = i64
    lib.ninfer_experts_prefetch.argtypes = [i64]
    lib.ninfer_experts_prefetch.restype = i64
    lib.ninfer_experts_team.argtypes = [i64]
    lib.ninfer_experts_team.restype = i64
    lib.ninfer_jobs_start.argtypes = [p]
    lib.ninfer_jobs_start.restype = i64
    lib.ninfer_jobs_stop.argtypes = [p, i64]
    lib.ninfer_jobs_stop.restype = None
    return lib


def use_isa(isa: str) -> str:
    """The widest of `ISAS` up to `isa` that this CPU runs, in effect from now on (the
    default at load: the widest it has); its name. `avx512-bf16` (VBMI and BF16) serves bf16
    inputs only (`cpu_experts_bf16.h`): fp32 inputs take `avx512` under it."""
    return ISAS[_library().ninfer_experts_isa(ISAS.index(isa))]


def use_prefetch(nbytes: int) -> int:
    """Prefetch `nbytes` ahead of each dot's reads from now on (-1: leave it; the default at
    load is 1024, the device host's best); the distance in effect."""
    return _library().ninfer_experts_prefetch(nbytes)


def use_spinning_team(spinning: int) -> bool:
    """Whether the worker's jobs run on the spinning team (1, the default) or on an OpenMP team
    (0: the benchmark's A/B) from now on (-1: leave it); the choice in effect."""
    return bool(_library().ninfer_experts_team(spinning))


def job_size() -> int:
    """sizeof(ninfer_moe_job) as compiled (the tests check the ctypes record against it)."""
    return _library().ninfer_moe_job_size()


def run_job(job) -> None:
    """`ninfer_cpu_moe_job(&job)` on this thread (the tests)."""
    _library().ninfer_cpu_moe_job(ctypes.addressof(job))


def start_worker(ctrl: torch.Tensor) -> int:
    """A thread running the jobs posted through `ctrl` (int64, zeroed: POSTED, DONE, STOP, a
    spare, then the job records' addresses; `kernels.host_handoff`); its handle for
    `stop_worker`."""
    handle = _library().ninfer_jobs_start(ctrl.data_ptr())
    if not handle:
        raise RuntimeError("could not start the CPU expert worker thread")
    return handle


def stop_worker(ctrl: torch.Tensor, handle: int) -> None:
    _library().ninfer_jobs_stop(ctrl.data_ptr(), handle)


def cpu_experts_unavailable() -> str | None:
    """None when the kernel runs here, else why not."""
    return unavailable(_library)


def takes(gate_up, down) -> bool:
    """Whether these `ExpertStack`s are fp8-row (e4m3 codes, one bf16 scale a row)."""
    return all(s.w.dtype == torch.float8_e4m3fn and s.scale is not None and s.scale.dim() == 2
               and s.scale.dtype == torch.bfloat16 and s.w.is_contiguous()
               and s.scale.is_contiguous() for s in (gate_up, down))


def fp8_experts(x: torch.Tensor, rows: list[int], experts: list[int], weights: list[float],
                gate_up, down, out: torch.Tensor, threads: int = 0) -> torch.Tensor:
    """See the module docstring: `x [B, H]` fp32 or bf16 and `out [B, H]` fp32 host tensors
    (bf16 x: the form of `use_isa("avx512-bf16")` where the CPU has it, which rounds the
    activations between the projections to bf16 as the device kernels do); `gate_up`, `down`
    fp8-row `ExpertStack`s on the host (`takes`); `threads` 0: OpenMP's default."""
    assert takes(gate_up, down) and not x.is_cuda and not gate_up.w.is_cuda
    assert x.dtype in (torch.float32, torch.bfloat16) and out.dtype == torch.float32
    assert x.is_contiguous() and out.is_contiguous()
    n = len(rows)
    if not n:
        return out
    hidden, width = down.w.shape[1], down.w.shape[2]
    assert x.shape[1] == hidden and max(experts) < gate_up.w.shape[0] and max(rows) < x.shape[0]
    pairs_rows = torch.tensor(rows, dtype=torch.int64)
    pairs_experts = torch.tensor(experts, dtype=torch.int64)
    pairs_weights = torch.tensor(weights, dtype=torch.float32)
    act = torch.empty(n, width, dtype=torch.float32)
    pairs = (n, pairs_rows.data_ptr(), pairs_experts.data_ptr(), pairs_weights.data_ptr(),
             gate_up.w.data_ptr(), gate_up.scale.data_ptr(), down.w.data_ptr(),
             down.scale.data_ptr())
    if x.dtype == torch.bfloat16:
        scratch = torch.empty(x.shape, dtype=torch.float32)
        _library().ninfer_fp8_experts_bf16(x.data_ptr(), x.shape[0], hidden, width, *pairs,
                                           scratch.data_ptr(), act.data_ptr(), out.data_ptr(),
                                           threads)
    else:
        _library().ninfer_fp8_experts(x.data_ptr(), hidden, width, *pairs, act.data_ptr(),
                                      out.data_ptr(), threads)
    return out


def fp8_experts_ref(x, rows, experts, weights, gate_up, down, out):
    """`fp8_experts` in float64 over the decoded codes (the tests' reference)."""
    width = down.w.shape[2]
    for r, e, w in zip(rows, experts, weights):
        gu = gate_up.w[e].double() * gate_up.scale[e].double()[:, None]
        h = gu @ x[r].double()
        a = torch.nn.functional.silu(h[:width]) * h[width:]
        dn = down.w[e].double() * down.scale[e].double()[:, None]
        out[r] += (w * (dn @ a)).to(out.dtype)
    return out
