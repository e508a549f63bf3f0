"""The captured step's CPU share of missed experts (`experts.host_jobs`): experts marked for the
host's cores map to the tier's zero row, the device kernels add nothing for them, and the
worker thread's fp32 sum is added (posted and collected by kernels: under the interpreter on
the CPU, inside a CUDA graph on CUDA). The compiled job itself (`ninfer_cpu_moe_job`) against
its float64 reference."""
from __future__ import annotations

import ctypes
import dataclasses

import pytest
import torch

from ninfer_engine.experts import plan_placement
from ninfer_engine.experts.host_jobs import HostJobs, MoeJob, default_threads
from ninfer_engine.experts.tiers import ExpertTiers
from ninfer_engine.kernels.cpu_experts import (ISAS, cpu_experts_unavailable, fp8_experts_ref,
                                               job_size, run_job, use_isa)
from ninfer_engine.kernels.moe_down import moe_down_combine_triton
from ninfer_engine.kernels.moe_fused import moe_gate_up_silu_triton
from ninfer_engine.models.packed import FP8_ROW, quantize_packed
from ninfer_engine.stats import ExpertStats
from tests.kernels.test_cpu_experts import _bound, _normal_codes, _stacks, _tables_form
from tests.tolerance import CAST, TRANSCENDENTAL, assert_within, bound

needs_kernel = pytest.mark.skipif(cpu_experts_unavailable() is not None,
                                  reason=str(cpu_experts_unavailable()))
# the CPU variant runs the hand-off kernels under the interpreter (not where CUDA is)
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(
    torch.cuda.is_available(), reason="the interpreter's CPU path")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])]


@needs_kernel
@pytest.mark.parametrize("I,H", [(32, 64), (64, 128)])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_the_compiled_job_sums_the_pairs_its_table_sends_to_the_zero_row(x_dtype, I, H):
    """Pairs whose table entry is `cpu_row` are summed (weights, rows) in fp32; others (slots,
    host reads -1 - e, the shared expert's row) are not; `out` is overwritten; counters count
    pairs and calls. Bound: both sides read the same codes; the job's fp32 dots (H, then I)
    and SiLU against float64, per output (`test_cpu_experts._bound`), with act's bf16
    rounding where the job takes the bf16 tables (bf16 rows, 64 | I, H, a CPU with them)."""
    gen = torch.Generator().manual_seed(0)
    E, k, rows, cpu_row = 6, 3, 3, 9
    gu, down = _stacks(E, I, H, gen, _normal_codes)
    table = torch.tensor([0, cpu_row, -3, cpu_row, 1, cpu_row, 2])  # E + 1: the shared row
    ids = torch.tensor([1, 0, 6, 3, 5, 2, 4, 6, 1])
    entries = table[ids]
    weights = torch.rand(rows * k, generator=gen)
    x = torch.randn(rows, H, generator=gen).to(x_dtype)
    out = torch.full((rows, H), 7.0)  # overwritten
    scratch = dict(xf=torch.empty(rows, H), act=torch.empty(rows * k, I),
                   pair_rows=torch.empty(rows * k, dtype=torch.int64),
                   pair_experts=torch.empty(rows * k, dtype=torch.int64),
                   pair_weights=torch.empty(rows * k))
    job = MoeJob(x=x.data_ptr(), ids=ids.data_ptr(), weights=weights.data_ptr(),
                 entries=entries.data_ptr(), rows=rows, k=k, H=H, I=I,
                 x_fp32=int(x_dtype == torch.float32), cpu_row=cpu_row, threads=2,
                 gu=gu.w.data_ptr(), gu_scale=gu.scale.data_ptr(), down=down.w.data_ptr(),
                 down_scale=down.scale.data_ptr(), out=out.data_ptr(),
                 **{n: t.data_ptr() for n, t in scratch.items()})
    run_job(job)
    pairs = [p for p in range(rows * k) if entries[p] == cpu_row]
    assert len(pairs) == 4 and job.pairs == 4 and job.calls == 1
    summed = ([p // k for p in pairs], [int(ids[p]) for p in pairs],
              [float(weights[p]) for p in pairs], gu, down)
    want = fp8_experts_ref(x.double(), *summed, torch.zeros(rows, H, dtype=torch.float64))
    tables = _tables_form(use_isa(ISAS[-1]), x, I, H)
    assert ((out.double() - want).abs() <= _bound(x, *summed, act_bf16=tables)).all()
    assert torch.equal(out[1], torch.zeros(H)) or any(p // k == 1 for p in pairs)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_marked_misses_run_on_the_host_and_the_rest_is_unchanged(device):
    """One fp8-row layer, 3 slots of 8, half the experts marked for the host's cores: the
    table sends a marked non-resident expert to the zero row (all zero), others to their slot
    or -1 - e; the step's kernels (remapped reads) plus the host job equal the kernels over
    every expert stacked, bit for bit on rows with no marked miss, within the kernels' bf16
    act rounding and the job's fp32 elsewhere (for a marked pair the stacked kernels store
    act in bf16, one cast: `CAST` roundings under the interpreter's truncation; both sides'
    dots are fp32 of depth H then I, with SiLU and the sum over k). On CUDA the same launches
    are captured into a CUDA graph (the job a host node) and replayed. Settling the routing
    counts the marked misses as CPU pairs, not device reads. A step whose pairs include no
    marked miss hands nothing to the worker and equals the stacked kernels bit for bit."""
    gen = torch.Generator().manual_seed(1)
    E, I, H, k, B = 8, 32, 64, 3, 4
    config = {"num_experts": E, "num_hidden_layers": 1, "hidden_size": H,
              "moe_intermediate_size": I}
    expert = 2 * I * H + 2 * I * 2 + H * I + H * 2

    def get(layer, e, member, shape):
        return quantize_packed(torch.randn(shape, generator=gen) / shape[1] ** 0.5, FP8_ROW)
    tiers = ExpertTiers(config, plan_placement(config, expert, 3 * expert), get, device,
                        "read", cpu_share=0.5)
    tier = tiers.layers[0]
    reads = tier.in_place
    assert tiers.cpu_share == 0.5 and reads.on_cpu.sum() == E // 2
    assert tiers.stats(ExpertStats()).cpu_layers == 1  # a fixed share: on from the start
    assert torch.equal(tier.slot_gu.w[tier.cpu_row].view(torch.uint8),
                       torch.zeros_like(tier.slot_gu.w[0].view(torch.uint8)))
    reads.prepare()
    reads.tables.push()
    table = reads.table.tolist()
    for e, s in enumerate(tier.map.slot_of):
        want = s if s >= 0 else (tier.cpu_row if reads.on_cpu[e] else -1 - e)
        assert table[e] == want
    marked = [e for e in range(E) if reads.on_cpu[e] and tier.map.slot_of[e] < 0]
    plain = [e for e in range(E) if not reads.on_cpu[e] and tier.map.slot_of[e] < 0]
    held = [e for e in range(E) if tier.map.slot_of[e] >= 0]
    assert marked and plain and held
    # row 0: held and plain misses only; rows 1-3 each route a marked miss
    routing = [[held[0], plain[0], held[1]], [marked[0], held[0], plain[-1]],
               [plain[0], marked[-1], marked[0]], [held[-1], marked[-1], plain[0]]]
    ids = torch.tensor(routing, device=device).view(-1)
    weights = torch.rand(B, k, generator=gen).to(device)
    y = torch.randn(B, H, generator=gen).to(torch.bfloat16).to(device)
    host = tiers.host.stacks[0]
    stacked = [s.w.to(device) for s in host] + [s.scale.to(device) for s in host]
    jobs = HostJobs([dict(tier=tier, moe=type("Moe", (), {"top_k": k - 1}))], B, device)

    def step(cpu=True):
        remap = reads.remaps()
        if cpu:
            jobs.post(tier, y, ids.view(B, k), weights)
        act = moe_gate_up_silu_triton(y, tier.slot_gu.w, ids, scale=tier.slot_gu.scale,
                                      remap=remap[0])
        out = torch.zeros(B, H, device=device)
        moe_down_combine_triton(act, tier.slot_down.w, ids, weights, B, k,
                                scale=tier.slot_down.scale, out=out, remap=remap[1])
        if cpu:
            jobs.collect(tier, out)
        return out

    act = moe_gate_up_silu_triton(y, stacked[0], ids, scale=stacked[2])
    want = torch.zeros(B, H, device=device)
    moe_down_combine_triton(act, stacked[1], ids, weights, B, k, scale=stacked[3], out=want)
    outs = [step()]
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        for _ in range(2):
            graph.replay()
        torch.cuda.synchronize()
        outs.append(captured)
    assert jobs.totals()[0] > 0 and jobs.worker is not None
    jobs.check()
    scale = want.abs().max()
    limit = bound(torch.bfloat16, H + I + k + TRANSCENDENTAL, roundings=CAST) * scale
    for got in outs:
        assert torch.equal(got[0], want[0])
        assert_within(got.cpu(), want.cpu(), limit.cpu())
    # without the job, the marked pairs are missing from rows 1-3 (the kernels add zeros)
    assert (step(cpu=False) - want)[1:].abs().max() > limit
    pairs = jobs.totals()[0]
    # a step with no marked pair skips the hand-off (the worker sees no job) and is exact
    settled = ids.tolist()
    ids.copy_(torch.tensor([held[0], plain[0], held[1]] * B, device=device))
    act = moe_gate_up_silu_triton(y, stacked[0], ids, scale=stacked[2])
    unmarked = torch.zeros(B, H, device=device)
    moe_down_combine_triton(act, stacked[1], ids, weights, B, k, scale=stacked[3], out=unmarked)
    if device == "cuda":
        graph.replay()
        torch.cuda.synchronize()
    got = captured if device == "cuda" else step()
    assert torch.equal(got, unmarked) and jobs.totals()[0] == pairs
    ids.copy_(torch.tensor(settled, device=device))
    reads.settle(ids.tolist())
    n_marked = sum(e in marked for e in ids.tolist())
    assert tier.cpu_pairs == n_marked == 4 and tier.cpu_experts == len(set(marked) & set(
        ids.tolist()))
    assert reads.read_pairs == sum(e in plain for e in ids.tolist())
    assert tier.device_pairs == B * k - n_marked


def test_no_marks_no_jobs():
    """A step over layers without CPU marks has no host jobs (no worker, nothing staged)."""
    jobs = HostJobs([dict(kind="gdn")], 4, "cpu")
    assert not jobs.active and jobs.worker is None


@needs_kernel
def test_the_job_record_has_the_c_layout():
    assert ctypes.sizeof(MoeJob) == job_size()


def test_the_worker_team_leaves_cores_for_the_engine(monkeypatch):
    """Three quarters of the cores, at least 4 left (1 of 2); the environment overrides."""
    from ninfer_engine.experts import host_jobs
    monkeypatch.delenv(host_jobs.THREADS_ENV, raising=False)
    for cores, team in ((1, 1), (2, 1), (8, 4), (16, 12), (64, 48)):
        monkeypatch.setattr(host_jobs.os, "sched_getaffinity", lambda _, n=cores: set(range(n)))
        assert host_jobs.default_threads() == team
    monkeypatch.setenv(host_jobs.THREADS_ENV, "3")
    assert host_jobs.default_threads() == 3


def test_auto_marks_the_share_that_balances_the_cores_against_the_bus(monkeypatch):
    """`--expert-cpu-share auto`: cpu / (cpu + bus), the cores' rate from timing
    `AUTO_EXPERTS` experts at the worker's team (a fake clock here: each call takes 2 ms),
    the bus's the measured host → slot copy; clamped to `AUTO_RANGE`; the layer's marks
    follow the share."""
    from ninfer_engine.experts import cost_model
    from ninfer_engine.experts import tiers as tiers_module
    E, I, H = 8, 32, 64
    config = {"num_experts": E, "num_hidden_layers": 1, "hidden_size": H,
              "moe_intermediate_size": I}
    expert = 2 * I * H + 2 * I * 2 + H * I + H * 2
    gen = torch.Generator().manual_seed(0)

    def get(layer, e, member, shape):
        return quantize_packed(torch.randn(shape, generator=gen), FP8_ROW)
    tiers = ExpertTiers(config, plan_placement(config, expert, 3 * expert), get, "cpu",
                        "read", cpu_share="auto")
    low, high = tiers_module.AUTO_RANGE
    assert low <= tiers.cpu_share <= high
    assert tiers.layers[0].in_place.on_cpu.sum() == round(tiers.cpu_share * E)
    first = tiers.layers[0]
    clock = [0.0]
    calls = []

    def timed_sum(x, rows, experts, weights, threads=0):
        calls.append((len(experts), threads))
        clock[0] += 2e-3
    monkeypatch.setattr(cost_model.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(first, "cpu_sum", timed_sum)
    n = tiers_module.AUTO_EXPERTS
    cpu = n * (first.host_gu.expert_bytes + first.host_down.expert_bytes) / 2e-3
    for bus, want in ((cpu, 0.5), (3 * cpu, 0.25), (cpu / 1e3, high), (cpu * 1e3, low)):
        tiers.costs = dataclasses.replace(tiers.costs, copy_bytes_per_s=bus)
        assert tiers.balanced_share(first) == pytest.approx(want)
    assert calls[0] == (n, default_threads())
