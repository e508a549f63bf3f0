"""The captured step's CPU share of missed experts (`experts.host_jobs`): the misses a layer's
split hands the host's cores map to the tier's zero row for its kernels, which add nothing for
them, and the worker thread's fp32 sum is added (posted and collected by kernels: under the
interpreter on the CPU, inside a CUDA graph on CUDA). The compiled job itself
(`ninfer_cpu_moe_job`) against its float64 reference; the split's counts (`balanced_count`,
`auto`'s timing)."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.experts import plan_placement
from ninfer_engine.experts.handoff_policy import HandoffPolicy
from ninfer_engine.experts.host_jobs import (HostJobs, MoeJob, default_threads, job_record,
                                             scratch)
from ninfer_engine.experts.tiers import ExpertTiers
from ninfer_engine.kernels.cpu_experts import (ISAS, cpu_experts_unavailable, fp8_experts_ref,
                                               job_size, run_job, use_isa)
from ninfer_engine.kernels.host_handoff import split_misses
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
    pairs, calls and each job's distinct experts. Bound: both sides read the same codes; the
    job's fp32 dots (H, then I) and SiLU against float64, per output
    (`test_cpu_experts._bound`), with act's bf16 rounding where the job takes the bf16 tables
    (bf16 rows, 64 | I, H, a CPU with them)."""
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
    assert len(pairs) == 4 and job.pairs == 4 and job.calls == 1 and job.experts == 3
    summed = ([p // k for p in pairs], [int(ids[p]) for p in pairs],
              [float(weights[p]) for p in pairs], gu, down)
    want = fp8_experts_ref(x.double(), *summed, torch.zeros(rows, H, dtype=torch.float64))
    tables = _tables_form(use_isa(ISAS[-1]), x, I, H)
    assert ((out.double() - want).abs() <= _bound(x, *summed, act_bf16=tables)).all()
    assert torch.equal(out[1], torch.zeros(H)) or any(p // k == 1 for p in pairs)


@needs_kernel
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_the_job_has_the_same_bits_on_any_team_and_any_number_of_jobs(x_dtype):
    """A job runs on the spinning team of its size (cpu_experts_team.h), which splits each
    projection's rows into contiguous runs and computes every output alone: teams of 1 to 4
    threads, each running a dozen jobs in a row (the task counter and the barrier reused,
    the team rebuilt when the size changes), give the one-thread job's bits every time."""
    gen = torch.Generator().manual_seed(3)
    E, k, rows, I, H, cpu_row = 6, 3, 3, 64, 128, 9
    gu, down = _stacks(E, I, H, gen, _normal_codes)
    ids = torch.tensor([1, 0, 5, 3, 5, 2, 4, 0, 1])
    entries = torch.full((rows * k,), cpu_row)
    weights = torch.rand(rows * k, generator=gen)
    x = torch.randn(rows, H, generator=gen).to(x_dtype)

    def job_out(threads: int) -> torch.Tensor:
        out = torch.empty(rows, H)
        buffers = dict(x=x, ids=ids, weights=weights, entries=entries, out=out,
                       **scratch(rows, k, H, I))
        job = job_record(SimpleNamespace(host_gu=gu, host_down=down), rows, k,
                         x_dtype == torch.float32, threads, cpu_row, buffers)
        run_job(job)
        assert job.pairs == rows * k
        return out
    one = job_out(1)
    for threads in (2, 3, 4, 2):
        for _ in range(12):
            assert torch.equal(job_out(threads), one)


@needs_kernel
@pytest.mark.parametrize("I,H,threads", [(32, 64, 1), (64, 128, 2)])
@pytest.mark.parametrize("device", DEVICES)
def test_the_split_misses_run_on_the_host_and_the_rest_is_unchanged(device, I, H, threads):
    """One fp8-row layer, 3 slots of 8, `--expert-cpu-share 0.5`: of m missed pairs a step
    the host takes round(m / 2), the first in pair order (`split_misses`). At rest the table
    maps every miss to -1 - e (read in place); in the step the stage kernel maps the picked
    misses' experts to the zero row (all zero) for the layer's kernels, the worker computes
    their pairs, and `collect` adds its sum and puts the table back. The kernels plus the
    host job equal the kernels over every expert stacked: bit for bit on rows with no picked
    pair; elsewhere within the kernels' bf16 act rounding and the job's fp32 (for a picked
    pair the stacked kernels store act in bf16, one cast: `CAST` roundings under the
    interpreter's truncation, and one more where the job takes the bf16 tables (64 | I, H on a
    CPU with them), which round act to bf16 too; both sides' dots are fp32 of depth H then I,
    with SiLU and the sum over k). The host's sum is the float64 reference of exactly the
    picked pairs within the job's own bound (`_bound`). On CUDA the same launches are
    captured into a CUDA graph and replayed. Settling a step counts its picked pairs as the
    CPU's and the other misses as device reads. A step with no miss hands nothing to the
    worker and is exact. The worker's team: 1 thread, and 2 (a spinning team the worker thread
    drives)."""
    gen = torch.Generator().manual_seed(1)
    E, k, B = 8, 3, 4
    config = {"num_experts": E, "num_hidden_layers": 1, "hidden_size": H,
              "moe_intermediate_size": I}
    expert = 2 * I * H + 2 * I * 2 + H * I + H * 2

    def get(layer, e, member, shape):
        return quantize_packed(torch.randn(shape, generator=gen) / shape[1] ** 0.5, FP8_ROW)
    tiers = ExpertTiers(config, plan_placement(config, expert, 3 * expert), get, device,
                        "read", cpu_share=0.5)
    tier = tiers.layers[0]
    reads = tier.in_place
    assert tiers.cpu_share == 0.5 and reads.split.tolist()[:7] == [0, 1, 1, 2, 2, 3, 3]
    assert tiers.stats(ExpertStats()).cpu_layers == 1
    assert torch.equal(tier.slot_gu.w[tier.cpu_row].view(torch.uint8),
                       torch.zeros_like(tier.slot_gu.w[0].view(torch.uint8)))
    reads.prepare()
    reads.tables.push()
    at_rest = reads.table.clone()
    assert at_rest[:E].tolist() == [s if s >= 0 else -1 - e
                                    for e, s in enumerate(tier.map.slot_of)]
    held = [e for e in range(E) if tier.map.slot_of[e] >= 0]
    miss = [e for e in range(E) if tier.map.slot_of[e] < 0]
    assert len(held) == 3 and len(miss) == 5
    # row 0 resident only; 6 missed pairs → the host takes 3 (pairs 3, 5, 6) and pair 7,
    # another of pair 3's expert; row 3's misses are read in place
    routing = [held, [miss[0], held[0], miss[1]], [miss[2], miss[0], held[1]],
               [held[2], miss[3], miss[4]]]
    ids = torch.tensor(routing, device=device).view(-1)
    picked = at_rest.clone()
    split_misses(ids, picked, reads.split, tier.cpu_row)
    host = [p for p in range(B * k) if picked[ids[p]] == tier.cpu_row]
    assert host == [3, 5, 6, 7]
    weights = torch.rand(B, k, generator=gen).to(device)
    y = torch.randn(B, H, generator=gen).to(torch.bfloat16).to(device)
    stacks = tiers.host.stacks[0]
    stacked = [s.w.to(device) for s in stacks] + [s.scale.to(device) for s in stacks]
    jobs = HostJobs([dict(tier=tier, moe=type("Moe", (), {"top_k": k - 1}))], B, device,
                    threads)  # (2: the worker drives a spinning team)

    def step():
        remap = reads.remaps()
        jobs.post(tier, y, ids.view(B, k), weights)
        act = moe_gate_up_silu_triton(y, tier.slot_gu.w, ids, scale=tier.slot_gu.scale,
                                      remap=remap[0])
        out = torch.zeros(B, H, device=device)
        moe_down_combine_triton(act, tier.slot_down.w, ids, weights, B, k,
                                scale=tier.slot_down.scale, out=out, remap=remap[1])
        jobs.collect(tier, out)
        return out

    def stacked_sum():
        act = moe_gate_up_silu_triton(y, stacked[0], ids, scale=stacked[2])
        out = torch.zeros(B, H, device=device)
        moe_down_combine_triton(act, stacked[1], ids, weights, B, k, scale=stacked[3], out=out)
        return out
    want = stacked_sum()
    outs = [step()]
    runs = 1
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        for _ in range(2):
            graph.replay()
        torch.cuda.synchronize()
        outs.append(captured)
        runs = 3
    assert torch.equal(reads.table, at_rest)  # the split's entries put back
    assert jobs.totals()[:2] == (runs * len(host), runs) and jobs.worker is not None
    jobs.check()
    x = y.cpu()
    tables = _tables_form(use_isa(ISAS[-1]), x, I, H)
    scale = want.abs().max()
    limit = bound(torch.bfloat16, H + I + k + TRANSCENDENTAL, roundings=CAST + tables) * scale
    for got in outs:
        assert torch.equal(got[0], want[0]) and torch.equal(got[3], want[3])
        assert_within(got.cpu(), want.cpu(), limit.cpu())
    pairs = ([p // k for p in host], [int(ids[p]) for p in host],
             [float(weights.view(-1)[p]) for p in host], *stacks)
    host_sum = fp8_experts_ref(x.double(), *pairs, torch.zeros(B, H, dtype=torch.float64))
    job_bound = _bound(x, *pairs, act_bf16=tables)
    assert ((jobs.out[:B].double() - host_sum).abs() <= job_bound).all()
    assert host_sum[1:3].abs().max() > 0 and not host_sum[[0, 3]].any()
    settled = ids.tolist()
    for _ in range(runs):
        reads.settle(settled)
    assert tier.cpu_pairs == runs * len(host) and tier.cpu_experts == runs * 3
    assert reads.read_pairs == runs * (6 - len(host))  # row 3's two misses
    assert tier.device_pairs == runs * (B * k - len(host))
    # a step with no miss hands nothing over (the worker sees no job) and is exact
    ids.copy_(torch.tensor(held * B, device=device))
    resident = stacked_sum()
    if device == "cuda":
        graph.replay()
        torch.cuda.synchronize()
    got = captured if device == "cuda" else step()
    assert torch.equal(got, resident) and jobs.totals()[:2] == (runs * len(host), runs)
    assert torch.equal(reads.table, at_rest)
    # `auto`'s policy off (`handoff_policy`): the same misses, none handed over, every one
    # read in place: the stacked sum bit for bit, no job posted (captured: a graph of its own)
    ids.copy_(torch.tensor(routing, device=device).view(-1))
    reads.policy = HandoffPolicy(reads.split.tolist(), 0.0, 1.0, 1.0, 1)
    reads.policy.on = False
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = step()
        graph.replay()
        torch.cuda.synchronize()
    else:
        got = step()
    assert torch.equal(got, want) and jobs.totals()[:2] == (runs * len(host), runs)
    assert torch.equal(reads.table, at_rest)


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


def test_balanced_count_is_the_best_split_of_a_layers_misses():
    """The closed form's candidates hold the brute-force optimum of max(host job, bus, the
    host DRAM floor), the smallest count at a tie; a job's fixed cost keeps a few misses on
    the bus, and so does a bus no slower than the cores (DRAM reads no faster than either)."""
    from ninfer_engine.experts.tiers import balanced_count
    gen = torch.Generator().manual_seed(3)
    for _ in range(4000):
        m = int(torch.randint(0, 40, (1,), generator=gen))
        fixed, per, bus, dram = (float(v) for v in torch.rand(4, generator=gen) * 1e-4)
        fixed *= float(torch.randint(0, 2, (1,), generator=gen))  # none half the time
        # DRAM measured (never slower than a side alone), or taken as the faster side's
        dram = min(dram, per, bus) if torch.randint(0, 2, (1,), generator=gen) else None

        def cost(c):
            floor = min(per, bus) if dram is None else dram
            return max(fixed * (c > 0) + c * per, (m - c) * bus, m * floor)
        best = min(range(m + 1), key=lambda c: (cost(c), c))
        assert balanced_count(m, fixed, per, bus, dram) == best
    # cores twice the bus's rate: half the misses (the floor: all of them at the cores' rate)
    assert balanced_count(4, 0.0, 1.0, 2.0) == 2 and balanced_count(5, 0.0, 1.0, 2.0) == 3
    assert balanced_count(5, 10.0, 1.0, 2.0) == 0 and balanced_count(0, 0.0, 1.0, 2.0) == 0
    assert balanced_count(9, 0.0, 1.0, 1.0) == 0  # the bus alone reads as fast as DRAM allows
    # the H100 host's timed costs (µs): the 0.5 split's counts from 2 to 7 misses, none of 1
    assert [balanced_count(m, 40, 31.4, 57) for m in range(1, 8)] == [0, 1, 2, 2, 3, 3, 4]
    # slower cores (42.8 µs an expert, bus 65.8): the cores' rate as the floor gives them 0.35
    # of many misses; DRAM timed at 110 GB/s (3.15 MB: 28.6 µs) 0.57, the fewest under it
    assert balanced_count(100, 40, 42.8, 65.8) == 35
    assert balanced_count(100, 40, 42.8, 65.8, 28.6) == 57


def test_auto_times_host_dram_over_the_stores_last_bytes(monkeypatch):
    """`host_read_seconds`: torch's sum over the host store's last `AUTO_READ_BYTES` as
    int64 words (aligned), its best time over those bytes: seconds a byte."""
    from ninfer_engine.experts import tiers as tiers_module
    tiers = fp8_tiers(2, None)
    buffer = tiers.host.buffer
    monkeypatch.setattr(tiers_module, "AUTO_READ_BYTES", 8 * 9 + 3)
    timed = []
    monkeypatch.setattr(tiers_module, "best_seconds", lambda fn: timed.append(fn()) or 0.5)
    assert tiers.host_read_seconds() == 0.5 / (8 * 9)
    start = buffer.numel() // 8 * 8 - 72  # (the buffer's size is whole words)
    assert int(timed[0]) == int(buffer[start: start + 72].view(torch.int64).sum())


def fp8_tiers(layers: int, share) -> ExpertTiers:
    """`layers` MoE layers of 16 random fp8-row experts (I 32, H 64), 3 slots each, misses
    read in place on the CPU, `--expert-cpu-share share`."""
    E, I, H = 16, 32, 64
    config = {"num_experts": E, "num_hidden_layers": layers, "hidden_size": H,
              "moe_intermediate_size": I}
    expert = 2 * I * H + 2 * I * 2 + H * I + H * 2
    gen = torch.Generator().manual_seed(0)

    def get(layer, e, member, shape):
        return quantize_packed(torch.randn(shape, generator=gen), FP8_ROW)
    return ExpertTiers(config, plan_placement(config, expert, layers * 3 * expert), get,
                       "cpu", "read", cpu_share=share)


def test_auto_splits_by_the_host_jobs_timed_costs(monkeypatch):
    """`--expert-cpu-share auto`: the host job's fixed and per-expert seconds from timing
    calls of 1 and `AUTO_EXPERTS` experts at the worker's team (faked here, the compiled
    job's own clock and `cpu_sum`'s wall clock alike: a call takes 0.1 ms + 1 ms an expert),
    each call on experts no earlier call read; the bus's per expert from the measured host →
    slot copy; each count of misses gets `balanced_count` with the hand-off's `HANDOFF_S`
    added to the fixed cost; `cpu_share` is the share of many misses."""
    from ninfer_engine.experts import cost_model
    from ninfer_engine.experts import host_jobs
    from ninfer_engine.experts import tiers as tiers_module
    tiers = fp8_tiers(1, "auto")
    E = tiers.placement.experts
    assert tiers.layers[0].in_place.split is not None  # (timed on the real clock)
    first = tiers.layers[0]
    clock = [0.0]
    calls = []

    def timed_sum(x, rows, experts, weights, threads=0):
        calls.append((list(experts), threads))
        clock[0] += 1e-4 + 1e-3 * len(experts)

    def timed_job(tier, experts, dtype, threads):
        assert tier is first and dtype == torch.float32  # the CPU step's rows
        calls.append((list(experts), threads))
        return 1e-4 + 1e-3 * len(experts)
    monkeypatch.setattr(cost_model.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(first, "cpu_sum", timed_sum)
    monkeypatch.setattr(host_jobs, "job_seconds", timed_job)
    fixed, per = tiers.host_costs(first)
    assert fixed == pytest.approx(1e-4) and per == pytest.approx(1e-3)
    read = [e for experts, _ in calls for e in experts]
    assert read[:E] == list(range(E)) and {t for _, t in calls} == {default_threads()}
    bus = first.expert_bytes / tiers.costs.copy_bytes_per_s
    monkeypatch.setattr(tiers, "host_costs", lambda tier: (1e-4, 1e-3))
    # host DRAM at 0.4 of the faster side's time an expert: the floor under the split
    dram = 0.4 * min(1e-3, bus)
    monkeypatch.setattr(tiers, "host_read_seconds", lambda: dram / first.expert_bytes)
    split = tiers.host_split("auto", first)
    assert tiers.auto_seconds["dram"] == pytest.approx(dram)
    want = [tiers_module.balanced_count(m, 1e-4 + tiers_module.HANDOFF_S, 1e-3, bus,
                                        tiers.auto_seconds["dram"])
            for m in range(tiers_module.SPLIT_SIZE)]
    assert split.dtype == torch.int32 and split.tolist() == want
    assert tiers.cpu_share == pytest.approx(max(0.0, min(bus / (1e-3 + bus), 1 - dram / bus)))
    # a read timed slower than the faster side alone is no floor: where the two sides cross
    slow = 1.5 * min(1e-3, bus)
    monkeypatch.setattr(tiers, "host_read_seconds", lambda: slow / first.expert_bytes)
    split = tiers.host_split("auto", first)
    assert tiers.auto_seconds["dram"] == 0.0
    assert tiers.cpu_share == pytest.approx(bus / (1e-3 + bus))
    assert split.tolist()[100] == tiers_module.balanced_count(
        100, 1e-4 + tiers_module.HANDOFF_S, 1e-3, bus, 0.0)
    fixed_share = tiers.host_split(0.25, first)
    assert fixed_share.tolist()[:9] == [0, 0, 1, 1, 1, 1, 2, 2, 2] and tiers.cpu_share == 0.25
    assert tiers.host_split(None, first) is None
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        tiers.host_split(1.5, first)
