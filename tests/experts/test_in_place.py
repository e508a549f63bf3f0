"""The captured step's path for offloaded experts (`experts.in_place`), on the CPU: the expert
kernels read a `Remap` (slots, or the host stacks in place) exactly as they read every expert
stacked; the kernel step (`HybridStep`, Triton under the interpreter) with misses read in place
gives the all-resident step's logits and the host-synced tier step's, bit for bit, on a layout
with a dense layer between MoE layers; admissions between steps are capped, unmap the victim
at once and map the copied expert a settle later."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.experts import plan_placement
from ninfer_engine.experts.tiers import ExpertTiers, expert_name
from ninfer_engine.kernels.moe_down import moe_down_combine_triton
from ninfer_engine.kernels.moe_fused import Remap, moe_gate_up_silu_triton
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from tests.engine.hybrid_helpers import HybridArtifact
from tests.models.qwen35_tiny import hf_config
from tests.hybrid_step_harness import StepHarness

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's CPU "
                                "path; test_cuda_tiers.py runs these reads on CUDA")
EXPERT_BYTES = (48 * 64 + 64 * 24) * 2  # one tiny expert (H 64, I 24) in bf16


def _elements(host, slots):
    return (host.data_ptr() - slots.data_ptr()) // host.element_size()


@pytest.mark.parametrize("fp8", [False, True])
def test_remapped_reads_equal_the_stacked_experts(fp8):
    """Two of six experts in slots (in another order), the rest read from the host stacks:
    gate|up and down (one program a row, and the B = 1 slot split) equal the kernels over
    every expert stacked, bit for bit; bf16 and fp8-row (codes and row scales remapped)."""
    torch.manual_seed(0)
    E, I, H, k = 6, 24, 64, 3
    gu, dn = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    if fp8:
        gu, dn = gu.to(torch.float8_e4m3fn), dn.to(torch.float8_e4m3fn)
        gs, ds = torch.rand(E, 2 * I).to(torch.bfloat16), torch.rand(E, H).to(torch.bfloat16)
    else:
        gu, dn, gs, ds = gu.to(torch.bfloat16), dn.to(torch.bfloat16), None, None
    held = [4, 1]  # slot 0 holds expert 4, slot 1 expert 1
    table = torch.tensor([held.index(e) if e in held else -1 - e for e in range(E)])

    def slots(t):
        return None if t is None else t[held].clone()
    sgu, sdn, sgs, sds = slots(gu), slots(dn), slots(gs), slots(ds)
    r_gu = Remap(table, _elements(gu, sgu), 0 if gs is None else _elements(gs, sgs))
    r_dn = Remap(table, _elements(dn, sdn), 0 if ds is None else _elements(ds, sds))
    for B in (2, 1):
        x = torch.randn(B, H).to(torch.bfloat16)
        ids = torch.tensor([4, 0, 1, 5, 4, 2][: B * k])
        w = torch.rand(B, k)
        act = moe_gate_up_silu_triton(x, gu, ids, scale=gs)
        assert torch.equal(act, moe_gate_up_silu_triton(x, sgu, ids, scale=sgs, remap=r_gu))
        split = dict(slot_split=k) if B == 1 else {}
        want, got = torch.zeros(B, H), torch.zeros(B, H)
        moe_down_combine_triton(act, dn, ids, w, B, k, scale=ds, out=want, **split)
        moe_down_combine_triton(act, sdn, ids, w, B, k, scale=sds, out=got, remap=r_dn, **split)
        assert torch.equal(want, got)


def _models(family: str, shared_width: int | None = None):
    hf = hf_config(family)
    if shared_width is not None:
        hf.shared_expert_intermediate_size = shared_width
    artifact = HybridArtifact(family, config=hf)
    config = artifact.config("text")

    def source(name, shape):
        return artifact.parameter(name, shape).to(torch.bfloat16)

    def tiered(miss):
        tiers = ExpertTiers(config, plan_placement(config, EXPERT_BYTES, 4 * 3 * EXPERT_BYTES),
                            lambda l, e, m, s: source(expert_name(l, e, m), s), "cpu", miss)
        model = Qwen35Model(config, FusedParams(config, tiers.placeholders(source), tiers))
        tiers.install(model)
        for tier in tiers.layers.values():  # admit on any difference: three steps admit
            tier.map.policy.z = 0.0
        return model
    return Qwen35Model(config, FusedParams(config, source)), tiered("read"), tiered("copy")


@pytest.mark.timeout(900)  # three interpreted kernel steps: ~2 min alone, more on a busy box
@pytest.mark.parametrize("shared_width", [40, 24])
def test_reads_in_place_equal_resident_and_the_host_synced_step(shared_width):
    """Qwen3-Next with layer 1 dense between MoE layers 0, 2, 3; four slots of eight a layer
    (two rows route at most four experts: the synced step never needs the CPU), two rows: three
    steps of the kernel step with misses read in place give the logits of every
    expert stacked and of the uncaptured tier step (misses copied before use), bit for bit.
    The routing log hands each MoE layer its own routing (the same per-expert counts as the
    host-synced step's), once per step; misses were read, hits found, and admissions made.
    A shared expert of the routed width (24) is a slot of the stacked layers and the row after
    the in-place tier's slots, so those two still agree bit for bit; the host-synced step keeps
    it apart (its own GEMV, added after), a different rounding, so its logits are not compared
    there."""
    resident, read, synced = _models("qwen3_next_mixed", shared_width)
    held = shared_width == 24
    assert read.expert_tiers.capturable and not synced.expert_tiers.capturable
    assert all((t.shared is not None) == held for t in read.expert_tiers.layers.values())
    assert all(t.shared is None for t in synced.expert_tiers.layers.values())
    assert resident.params.shared_in_stack("text/layers/0/moe/") == held
    assert sorted(read.expert_tiers.layers) == [0, 2, 3]
    prompts = [torch.tensor([3, 17, 99, 5, 64, 120, 7, 41]), torch.tensor([9, 8, 100, 2])]
    logits = []
    for model in (resident, read, synced):
        torch.manual_seed(0)  # the harness's shuffled page table
        step = StepHarness(model, model.params, 64, batch=2)
        for row, prompt in enumerate(prompts):
            state = model.new_state()
            model.forward(prompt, state)
            step.load_state(state, row)
        tok, out = torch.tensor([11, 50]), []
        for _ in range(3):
            out.append(step.step(tok))
            tok = out[-1].argmax(-1)
        step.core.settle()  # the last step's routing
        logits.append(out)
    for want, a, b in zip(*logits):
        assert torch.equal(want, a) and (held or torch.equal(want, b))
    tiers = read.expert_tiers.layers
    for i, tier in tiers.items():
        # (held: the synced step's other rounding may route a later layer otherwise)
        assert held or tier.routed == synced.expert_tiers.layers[i].routed, i
        assert sum(tier.routed) == (12 + 3 * 2) * 2  # prompts' tokens + steps × rows, top-2
    reads = [t.in_place for t in tiers.values()]
    assert sum(r.read_pairs for r in reads) > 0 and sum(r.admitted for r in reads) > 0
    assert sum(t.map.hits for t in tiers.values()) > 0
    assert all(r.admitted <= 3 for r in reads)  # one admission a layer a step at most


def test_admissions_wait_for_the_step_and_prefer_hotter_experts():
    """Between steps: the busiest miss is admitted (one a layer a step), its victim unmapped
    at once (the next step reads it in place), the admitted expert mapped a settle later,
    once its copy has landed, its slot holding its host bytes; under LFU a miss no hotter
    than every resident is read in place and not admitted."""
    from ninfer_engine.experts.in_place import InPlaceReads, Tables
    from ninfer_engine.experts.slot_cache import LfuAgingPolicy
    from ninfer_engine.experts.tier import LayerTier
    from ninfer_engine.models.experts import ExpertStack
    E, I, H = 6, 4, 8
    host = (ExpertStack(torch.randn(E, 2 * I, H)), ExpertStack(torch.randn(E, H, I)))
    tier = LayerTier(host, 2, I, "cpu", LfuAgingPolicy(E, z=0.0), "read")
    reads = InPlaceReads(tier, Tables(1, E, torch.device("cpu")), 0)
    assert reads.table.tolist() == [0, 1, -3, -4, -5, -6, 0]  # E: no shared expert
    reads.settle([0, 5, 4, 5])  # misses 5 (twice) and 4: 5 admitted over cold expert 1
    reads.tables.push()
    assert reads.admitted == 1 and reads.read_pairs == 3 and tier.map.slot_of[5] == 1
    assert reads.table.tolist()[:E] == [0, -2, -3, -4, -5, -6]  # 5 not mapped before it lands
    reads.settle([0, 5])  # the copy has landed: mapped; a hit now
    reads.tables.push()
    assert reads.table.tolist()[:E] == [0, -2, -3, -4, -5, 1]
    assert torch.equal(tier.slot_gu.w[1], host[0].w[5]) and tier.map.hits == 3
    reads.settle([2, 0])  # 2 (count 1) is not hotter than 5 (count 2), its only candidate
    assert reads.admitted == 1 and tier.map.slot_of[2] == -1 and reads.read_pairs == 4


def test_the_shared_expert_stays_the_row_after_the_slots_through_resizes():
    """`hold_shared` puts the shared expert after the slots (table column E points at it);
    lending's grow and shrink keep it there, bytes unchanged, as the kept experts move; a
    shared expert in another form than the slots' is refused and nothing changes."""
    from ninfer_engine.experts.in_place import InPlaceReads, Tables
    from ninfer_engine.experts.slot_cache import LfuAgingPolicy
    from ninfer_engine.experts.tier import LayerTier
    from ninfer_engine.models.experts import ExpertStack
    E, I, H = 6, 4, 8
    host = (ExpertStack(torch.randn(E, 2 * I, H)), ExpertStack(torch.randn(E, H, I)))
    tier = LayerTier(host, 2, I, "cpu", LfuAgingPolicy(E), "read")
    reads = InPlaceReads(tier, Tables(1, E, torch.device("cpu")), 0)
    shared = (ExpertStack(torch.randn(1, 2 * I, H)), ExpertStack(torch.randn(1, H, I)))
    assert not tier.hold_shared(ExpertStack(shared[0].w.to(torch.bfloat16)), shared[1])
    assert tier.shared is None and tier.slot_gu.w.shape[0] == 2
    assert tier.hold_shared(*shared)
    for slots in (2, 4, 1):
        if slots != tier.map.slots:
            tier.resize(slots)
        reads.prepare()
        reads.tables.push()
        assert tier.shared_row == slots and reads.table[E] == slots
        assert tier.slot_gu.w.shape[0] == tier.slot_down.w.shape[0] == slots + 1
        assert torch.equal(tier.slot_gu.w[slots], shared[0].w[0])
        assert torch.equal(tier.slot_down.w[slots], shared[1].w[0])
        for e, s in enumerate(tier.map.slot_of):  # the kept experts' bytes moved with them
            if s >= 0:
                assert torch.equal(tier.slot_gu.w[s], host[0].w[e]) and reads.table[e] == s


def test_a_table_push_in_flight_is_not_waited_for():
    """While a push queued behind a step still reads one host copy of the tables, the host
    writes the other, brought up to date first; it waits only when both are being read."""
    from ninfer_engine.experts.in_place import Tables

    class Push:  # a push event: done or not, and whether anyone waited for it
        def __init__(self, done):
            self.done, self.waited = done, False

        def query(self):
            return self.done

        def synchronize(self):
            self.waited = True

    tables = Tables(2, 3, torch.device("cpu"))
    tables.writable()[1, 2] = 7
    first = Push(done=False)
    tables._pushed[0] = first  # the copy just pushed is still being read
    rows = tables.writable()
    assert rows is tables._rows[1] and rows[1, 2] == 7 and not first.waited
    rows[0, 0] = 5
    tables.dirty = True
    tables.push()
    assert tables.device[0, 0] == 5 and tables.device[1, 2] == 7
    second = Push(done=False)
    tables._pushed[1] = second  # both copies read by pushes in flight: wait for the older
    assert tables.writable() is tables._rows[0] and first.waited and not second.waited
    assert tables._rows[0][0, 0] == 5


def test_lfu_admits_only_a_significantly_hotter_miss():
    """`prefers` at z = 2: a miss must beat its victim's count by more than two standard
    deviations of their Poisson noise (2·sqrt(sum)); at z = 0 by anything (TinyLFU)."""
    from ninfer_engine.experts.slot_cache import LfuAgingPolicy
    policy = LfuAgingPolicy(5)
    policy.count[:] = [16.0, 7.0, 40.0, 5.0, 4.0]
    assert not policy.prefers(0, 1)  # 9 ≤ 2·sqrt(23) ≈ 9.6
    assert policy.prefers(2, 1)  # 33 > 2·sqrt(47) ≈ 13.7
    assert not policy.prefers(1, 0)
    policy.count[1] = 0.0
    assert policy.prefers(3, 1) and not policy.prefers(4, 1)  # 5 > sqrt(20) ≈ 4.47; 4 = 4
    policy.z = 0.0
    assert policy.prefers(0, 3) and not policy.prefers(1, 1)


def test_settle_counts_the_host_jobs_pairs_as_the_cpus():
    """With a split (`hand_misses`) the table at rest keeps -1 - e for every miss (the step
    picks the host's share on the device) and the tier holds its zero row; a settle counts
    every miss as read in place, then moves the pairs the host jobs report (their records'
    `pairs` and `experts`) to the CPU's counts, each once."""
    from types import SimpleNamespace

    from ninfer_engine.experts.in_place import InPlaceReads, Tables
    from ninfer_engine.experts.slot_cache import LfuAgingPolicy
    from ninfer_engine.experts.tier import LayerTier
    from ninfer_engine.models.experts import ExpertStack
    E, I, H = 16, 4, 8
    host = (ExpertStack(torch.randn(E, 2 * I, H)), ExpertStack(torch.randn(E, H, I)))
    tier = LayerTier(host, 2, I, "cpu", LfuAgingPolicy(E), "read")
    reads = InPlaceReads(tier, Tables(1, E, torch.device("cpu")), 0, admit_per_step=0)
    reads.hand_misses(torch.tensor([0, 1, 1, 2], dtype=torch.int32))
    record = SimpleNamespace(pairs=0, experts=0)
    reads.jobs.append(record)
    reads.prepare()
    reads.tables.push()
    assert tier.zero_row and reads.table.tolist()[:E] == [0, 1, *(-1 - e for e in range(2, E))]
    reads.settle([2, 3, 0])
    assert (tier.device_pairs, reads.read_pairs, tier.cpu_pairs) == (3, 2, 0)
    record.pairs, record.experts = 3, 2  # the step's job: expert 4 for two tokens, and 5
    reads.settle([4, 4, 5, 0])
    assert (tier.device_pairs, reads.read_pairs) == (3 + 4 - 3, 2 + 3 - 3)
    assert (tier.cpu_pairs, tier.cpu_experts) == (3, 2)
    reads.settle([0])  # counted once
    assert (tier.cpu_pairs, tier.cpu_experts, tier.device_pairs) == (3, 2, 5)
