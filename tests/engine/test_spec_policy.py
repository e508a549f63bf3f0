"""`SpecPolicy`: speculation follows the measured step rates of each batch-size bucket."""

from ninfer_engine.step.spec_policy import PROBE, PROBE_MAX, SpecPolicy, bucket


def _run(policy, batch, plain_rate, verify_rate, steps):
    """Steps at fixed rates (tokens/s); how many of them verified."""
    verified = 0
    for _ in range(steps):
        v = policy.speculate(batch)
        verified += v
        policy.record(batch, v, batch * 10, batch * 10 / (verify_rate if v else plain_rate))
    return verified


def test_buckets_group_batch_sizes():
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 16)] == [0, 1, 2, 2, 3, 3, 4, 4]


def test_verify_steps_continue_while_they_are_faster():
    policy = SpecPolicy()
    # the first plain step, then a plain probe in PROBE steps
    assert _run(policy, 1, plain_rate=500, verify_rate=700, steps=200) >= 200 - 1 - 200 // PROBE
    assert policy.skipped == 0


def test_a_losing_side_is_only_probed():
    policy = SpecPolicy()
    verified = _run(policy, 8, plain_rate=1470, verify_rate=940, steps=320)
    # the first verify step, then one probe in PROBE steps
    assert verified <= 1 + 320 // PROBE + 1 and policy.skipped > 250
    assert policy.rates(8) == (1470.0, 940.0) and policy.rates(5) == policy.rates(8)
    # another bucket keeps its own estimate: speculation still pays at batch 1
    assert _run(policy, 1, plain_rate=480, verify_rate=700, steps=100) >= 100 - 1 - 100 // PROBE


def test_the_choice_follows_acceptance_as_it_changes():
    policy = SpecPolicy()
    # drafts mostly rejected: verify measured at step 1, probed at steps 2 + PROBE = 34 and
    # 34 + 2·PROBE = 98, both losing, so the next probe waits 4·PROBE (step 226)
    _run(policy, 4, plain_rate=1000, verify_rate=600, steps=100)
    # acceptance recovers: that probe sees it and verify steps take over
    late = _run(policy, 4, plain_rate=1000, verify_rate=1500, steps=8 * PROBE)
    # 126 steps until that probe, then a plain probe every PROBE steps (the wait reset)
    assert late >= 8 * PROBE - (226 - 100) - 8


def test_probes_back_off_while_the_loser_keeps_losing():
    # batch 8 at 2.4 tokens a round, a verify step 0.64x a plain one: probes at waits of
    # PROBE, 2·PROBE, ... doubling up to PROBE_MAX (32 + 64 + ... + 512 = 992 steps), then
    # one every PROBE_MAX; against one every PROBE, 4,000 steps probe 10 times, not 125
    policy = SpecPolicy()
    verified = _run(policy, 8, plain_rate=1470, verify_rate=940, steps=4000)
    doubling = (PROBE_MAX // PROBE).bit_length()  # 5 probes until the wait is PROBE_MAX
    assert verified <= 1 + doubling + (4000 - 992) // PROBE_MAX + 1
    assert verified * (1 - 940 / 1470) / 4000 < 0.001  # what the probes cost: under 0.1 %


def test_a_speculators_reset_keeps_the_kind_of_policy_it_was_given():
    """The engine resets its speculator after the load's warm-up (CUDA): a policy a benchmark
    or a test set before (`AlwaysSpeculate`) stays that kind, its timings from zero; on CUDA
    the served-twice tests drafted by step timings until then, so their rounds differed."""
    from ninfer_engine.step.spec_policy import AlwaysSpeculate
    from ninfer_engine.step.speculation import Speculator

    spec = Speculator("ngram", 3)
    assert type(spec.policy) is SpecPolicy
    spec.policy.record(1, False, 1, 1.0)
    spec.reset()
    assert type(spec.policy) is SpecPolicy and spec.policy.rates(1) == (None, None)
    spec.policy = AlwaysSpeculate()
    spec.reset()
    assert type(spec.policy) is AlwaysSpeculate
