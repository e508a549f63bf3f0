"""`--spec mtp` and `--vision` at `--tp 2` over gloo (two rank processes) against tp1:

- MTP (the tiny qwen3_5, its MTP layer sharded by heads and intermediate; the tiny qwen3_5_moe,
  its routed experts by id): the plain greedy tokens, the same drafting rounds, drafts and
  acceptance counts as tp1, every acceptance length occurring (drafts steered), so verify
  rows are cut back and the MTP state follows on both ranks;
- vision (a tiny converted multimodal qwen3_5): two requests with an image each, prefilled in
  chunks that cut through the images, give tp1's greedy tokens (rank 0 encodes, rank 1 takes
  the encoder rows it sends);
- each `--profile`'s flag set (int8 KV, MTP drafts; flash-next's elastic pool; 27b's vision,
  device and host state slots and host KV tier), sized for the CPU, starts at tp2 and gives
  tp1's tokens;
- the prefix cache (rank 0's tree, its copies replayed on rank 1): a repeated prompt and a
  longer one restore what they restore at tp1 (llama: page tails; qwen3_5: state snapshots)
  and give tp1's tokens.
"""
from __future__ import annotations

import pytest

from ninfer_engine.engine import Engine

from .feature_ranks import (
    MTP_CASES, MTP_TOKENS, PREFIX_CASES, PROFILES, PROMPTS, VISION_TOKENS, image_requests,
    mtp_engine, mtp_result, plain_mtp_run, prefix_config, prefix_run, profile_engine,
    profile_run, run_feature_ranks, stepped, vision_config, write_vl_mtp_artifact,
)
from .ranks import artifact

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def vision_path(tmp_path_factory):
    from tests.vision.tiny_vl import hf_vl_model, write_vl_artifact

    return write_vl_artifact(hf_vl_model("qwen3_5"), tmp_path_factory.mktemp("vl"))


@pytest.fixture(scope="module")
def wants():
    return {family: plain_mtp_run(family) for family, _ in MTP_CASES}


@pytest.fixture(scope="module")
def paths(vision_path, tmp_path_factory):
    return {"vision": vision_path, "flash-next": vision_path,  # (its artifact is in memory)
            "27b": write_vl_mtp_artifact(tmp_path_factory.mktemp("vl-mtp"))}


@pytest.fixture(scope="module")
def two_ranks(wants, paths):
    return run_feature_ranks(wants, paths)


@pytest.mark.parametrize("family, experts", MTP_CASES)
def test_mtp_drafts_at_tp2_as_at_tp1(two_ranks, wants, family, experts):
    assert family in two_ranks, "the two ranks gave no result"
    tokens, counters, proposals = two_ranks[family]
    engine = mtp_engine(family, experts, wants[family])
    try:
        expected = mtp_result(engine, stepped(engine, PROMPTS, MTP_TOKENS))
    finally:
        engine.stop()
    assert tokens == [wants[family][f"r{i}"] for i in range(len(PROMPTS))]
    rounds, drafted, accepted, per_position = counters
    # steered drafts: some taken in full, some cut back after each position
    assert 0 < accepted < drafted and all(per_position)
    assert (tokens, counters) == expected[:2]
    # the sharded head drafted what the whole head drafts (before the steering)
    assert proposals == expected[2] and len(proposals) == rounds


def test_an_image_prompt_at_tp2_gives_tp1s_tokens(two_ranks, vision_path):
    assert "vision" in two_ranks, "the two ranks gave no result"
    engine = Engine(vision_config(vision_path))
    try:
        prompts, media = image_requests(engine)
        assert all(m.media_tokens > 16 for m in media)  # spans cross chunk boundaries
        expected = stepped(engine, prompts, VISION_TOKENS, media)
    finally:
        engine.stop()
    assert two_ranks["vision"] == expected
    assert all(len(t) == VISION_TOKENS for t in expected)


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profiles_flags_start_at_tp2_and_give_tp1s_tokens(two_ranks, paths, profile):
    assert profile in two_ranks, "the two ranks gave no result"
    engine = profile_engine(profile, paths[profile])
    try:
        c = engine.config
        assert (c.tp, c.kv_dtype, c.spec, c.draft_tokens, c.elastic, c.vision) == (
            2, "int8", "mtp", 3, profile == "flash-next", profile == "27b")
        expected = profile_run(profile, engine)
        storage = engine.memory.storage
    finally:
        engine.stop()
    tokens, rounds, host_tier = two_ranks[profile]
    assert tokens == expected[0] and rounds == expected[1] > 0
    # half the state a slot; the host KV budget holds pages of half the heads at tp 2, without
    # tp 1's MTP rows (`rank_parts`): each side's allocation is the budget rounded down to its
    # own pages, so tp 2's is less than one of its pages short of tp 1's, if at all
    kv, states = expected[2]
    rows = storage.page_tokens * storage.row_width * storage.dtype.itemsize
    assert host_tier[1] == states // 2 and host_tier[0] > kv - (storage.page_bytes - rows) // 2
    assert (min(host_tier) > 0) == (profile == "27b")


@pytest.mark.parametrize("family", PREFIX_CASES)
def test_the_prefix_cache_at_tp2_restores_what_tp1_restores(two_ranks, family):
    assert f"prefix-{family}" in two_ranks, "the two ranks gave no result"
    engine = Engine(prefix_config(), artifact(family))
    try:
        expected = prefix_run(engine)
    finally:
        engine.stop()
    tokens, hits, restored, tree = two_ranks[f"prefix-{family}"]
    assert tokens == expected[0] and tokens[0] == tokens[1]
    # the repeat restores all but its last token, the longer prompt at least as much; the
    # hybrid tree demoted pages and moved snapshots to the host tier on the way
    assert (hits, restored, tree) == expected[1:] and hits == 2 and restored >= 2 * 149
    assert min(tree) > 0 or family == "llama"
