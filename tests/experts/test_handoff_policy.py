"""`auto`'s hand-off policy (`experts.handoff_policy`): what the split saves a layer-step by
`balanced_count`'s own cost model, the switch off where that does not pay for the hand-off's
kernels and back on where it does, two windows in a row either way, and its wiring: one policy
for every offloaded layer of `auto`, none for a fixed share, each step's misses from `settle`,
and the decoder's graph form."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from ninfer_engine.experts.handoff_policy import AGAINST, LAUNCH_S, HandoffPolicy
from ninfer_engine.experts.tiers import balanced_count
from ninfer_engine.models.qwen3_5_engine_step import EngineHybridDecoder
from ninfer_engine.stats import ExpertStats
from tests.experts.test_host_jobs import fp8_tiers

US = 1e-6
# the H100 host's timed costs (the host job's fixed cost with the hand-off's round trip, an
# expert on the cores, an expert over the bus), as test_host_jobs' split test
FIXED, PER, BUS = 60 * US, 31.4 * US, 57 * US


def policy(layers=2, window=3) -> HandoffPolicy:
    counts = [balanced_count(m, FIXED, PER, BUS) for m in range(64)]
    return HandoffPolicy(counts, FIXED, PER, BUS, layers, window=window)


def test_saving_is_the_bus_alone_less_the_split_by_its_cost_model():
    p = policy()
    for m in range(40):
        c = p.counts[m]

        def cost(n):
            return max(FIXED * (n > 0) + n * PER, (m - n) * BUS, m * min(PER, BUS))
        assert p.saving(m) == pytest.approx(cost(0) - cost(c), abs=1e-12)
        assert p.saving(m) >= 0 and (p.saving(m) == 0) == (c == 0)
    assert p.saving(1) == 0.0 and p.saving(5) > LAUNCH_S  # one miss stays on the bus
    c = p.counts[-1]  # past the counts, the last count (`SPLIT_SIZE`'s rule)
    assert p.saving(500) == pytest.approx(500 * BUS - max(FIXED + c * PER, (500 - c) * BUS,
                                                          500 * PER))


def test_few_misses_switch_the_hand_off_off_and_many_back_on(caplog):
    """A window is `window` steps of every layer. Windows of 0-1 misses a layer-step (the
    split hands the cores none) save nothing: off after `AGAINST` of them in a row, not after
    one, and a window for the current form in between starts the count again. Five misses a
    layer-step (half a uniform top-10 off the device) pay: back on after two such windows."""
    p = policy()
    span = 2 * 3

    def window(misses):
        for i in range(span):
            p.observe(misses[i % len(misses)])
    assert AGAINST == 2 and p.on
    window([0, 1])
    assert p.on  # one window against
    window([5])
    window([0, 1])
    assert p.on  # the count started again
    caplog.set_level(logging.INFO, logger="ninfer.engine")
    window([0])
    assert not p.on and p.switches == 1
    assert "hand-off to the host's cores off: it saved only 0.0 µs" in caplog.text
    window([0, 5])  # five misses every other layer-step: it pays on average
    assert p.saving(5) / 2 > LAUNCH_S and not p.on
    window([5])
    assert p.on and p.switches == 2
    assert "hand-off to the host's cores on: it saves" in caplog.text


def test_auto_gives_every_offloaded_layer_one_policy_fed_by_settle():
    """`auto`: one policy for both layers, fed each layer-step's missed pairs by `settle`
    (the expert → slot map's misses, each counted by its pairs); off, no layer hands misses
    and the decoder captures the other form (the stats' `cpu_layers` count only layers that
    hand now); a fixed share has no policy and always hands."""
    tiers = fp8_tiers(2, "auto")
    p = tiers.handoff
    assert isinstance(p, HandoffPolicy) and p.counts == tiers.layers[0].in_place.split.tolist()
    reads = [t.in_place for t in tiers.layers.values()]
    assert all(r.policy is p and r.handing for r in reads)
    seen = []
    p.observe = seen.append
    tier = tiers.layers[0]
    held = [e for e, s in enumerate(tier.map.slot_of) if s >= 0]
    miss = [e for e, s in enumerate(tier.map.slot_of) if s < 0]
    reads[0].settle([held[0], miss[0], miss[0], miss[1], held[1]])
    assert seen == [3]
    decoder = SimpleNamespace(core=SimpleNamespace(w=SimpleNamespace(
        model=SimpleNamespace(expert_tiers=tiers))))
    form = EngineHybridDecoder.graph_form.fget
    assert form(decoder) == 0 and tiers.stats(ExpertStats()).cpu_layers == 2
    p.on = False
    assert not any(r.handing for r in reads) and form(decoder) == 1
    assert tiers.stats(ExpertStats()).cpu_layers == 0  # the console: no layer hands now
    fixed = fp8_tiers(2, 0.5)
    assert fixed.handoff is None and all(t.in_place.handing for t in fixed.layers.values())
    decoder.core.w.model.expert_tiers = fixed
    assert form(decoder) == 0
