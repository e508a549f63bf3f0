"""`ninfer bench` orchestration on the CPU: CUDA timing faked, the tiny model run for real."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.benchmark import engine_step, forced_drafts, report, run
from tests.benchmark.tiny import tiny_config, tiny_source
from tests.engine.helpers import default_resources


def _fake_rates(monkeypatch, moe: bool = False):
    """The two CUDA-only rates the rooflines divide by, the 2-layer 512-token-vocabulary model
    of `tiny` (the synthetic tiny archs' real vocabulary makes every step's head and sampling
    cost more than the rest) with a byte tokenizer (the real Qwen one takes ~20 s to build), and
    fewer timed steps; everything else runs for real."""
    monkeypatch.setattr(run, "copy_bandwidth_gbps", lambda: 4000.0)
    monkeypatch.setattr(run, "matmul_tflops", lambda: 800.0)
    config = tiny_config(moe)
    source = tiny_source(config, mtp=True)
    monkeypatch.setattr(run, "build_synthetic", lambda arch, device, dtype, layers, mtp: (
        config, lambda name, shape: source(name, shape).to(device, dtype)))
    monkeypatch.setattr(engine_step.qwen_resources, "resources", lambda vocab: default_resources())
    monkeypatch.setattr(run, "SKIP", 2)
    monkeypatch.setattr(run, "DECODE_STEPS", 8)


CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="the CPU run of the bench (fp32: exact greedy equality)")


@CPU_ONLY
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_bench_runs_the_serving_engine(monkeypatch, moe):
    """Every section through the real engine on the CPU (tiny model, fp32): the figures come
    from its steps; the oracle at 3 tokens a round (k = 3: two drafts right, one wrong, every
    round) gives exactly 3 tokens a round."""
    _fake_rates(monkeypatch, moe)
    peers = []

    def fake_peer(cfg, prompt, steps):
        peers.append((cfg["hidden_size"], prompt, steps))
        return dict(library="transformers", version="x", prompt_tokens=prompt, decode_steps=steps,
                    prefill_tok_s=1000.0, decode_tok_s=50.0, attn_implementation="sdpa")

    monkeypatch.setattr("ninfer_engine.benchmark.peer.run_peer", fake_peer)
    arch = "tiny-moe" if moe else "tiny-dense"
    result = run.run_decode_bench(arch, [100], command="ninfer bench", concurrency=[1, 3],
                                  concurrency_context=70, prefill=96, prefill_chunk=64,
                                  peer="transformers", peer_prompt=96, peer_steps=4,
                                  spec_rates=[3.0], spec_batches=[1])
    json.dumps(result)  # JSON-able
    assert result["not_measured"] == {}
    (decode,) = result["decode"]
    assert decode["context"] == 100 and decode["steps"] == run.DECODE_STEPS
    assert decode["tok_s"] == pytest.approx(1e3 / decode["step_ms"]) and decode["prefill_ms"] > 0
    conc = result["concurrency"]
    assert [r["concurrency"] for r in conc] == [1, 3]
    for r in conc:
        assert r["roofline_tok_s"] == min(r["bandwidth_roofline_tok_s"], r["flop_roofline_tok_s"])
        assert r["fraction_of_roofline"] == pytest.approx(r["tok_s"] / r["roofline_tok_s"])
    assert conc[1]["bytes_per_step"] > conc[0]["bytes_per_step"]
    assert ("experts_read_per_layer" in conc[0]) == moe
    (spec,) = result["speculative"]
    assert spec["concurrency"] == 1 and spec["tokens_per_round"] == 3.0
    assert spec["acceptance"] == pytest.approx(2 / 3) and spec["speedup"] > 0
    assert spec["policy_tok_s"] > 0
    pre = result["prefill"]
    assert pre["tokens"] == 96 and pre["chunks"] == 2 and pre["tok_s"] > 0
    assert pre["fraction_of_roofline"] == pytest.approx(pre["tok_s"] / pre["roofline_tok_s"])
    assert peers == [(result["config"]["hidden_size"], 96, 4)]
    assert result["peer"]["ratio_decode"] == pytest.approx(decode["tok_s"] / 50.0)
    text = report.markdown(result)
    for heading in ("Batch-1 decode", "Aggregate decode", "Speculative decoding",
                    "Prefill of a 96-token", "Peer:"):
        assert heading in text
    assert "Not measured" not in text and "| 3.00 → 3.00 | 67 % |" in text


@CPU_ONLY
def test_served_sampling_times_the_presets_penalties(monkeypatch):
    """`--sampling served`: the decode and concurrency requests carry the model preset with
    temperature 0 (the Qwen3.5 presets' presence_penalty 1.5 included), as a served request
    sending only temperature 0 does; the report says so."""
    import dataclasses

    from ninfer_engine.types import SamplingParams

    _fake_rates(monkeypatch)
    preset = SamplingParams(temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5)
    monkeypatch.setattr(run, "served_sampling",
                        lambda engine: dataclasses.replace(preset, temperature=0.0))
    sent = []
    real = run.run_requests

    def spy(engine, prompts, max_tokens, sampling=SamplingParams(temperature=0.0)):
        sent.append(sampling)
        return real(engine, prompts, max_tokens, sampling)
    monkeypatch.setattr(run, "run_requests", spy)
    result = run.run_decode_bench("tiny-dense", [60], concurrency=[2], concurrency_context=40,
                                  peer="none", sampling="served")
    assert result["sampling"] == "served" and len(result["decode"]) == 1
    assert sent and all(p.presence_penalty == 1.5 and p.temperature == 0.0 for p in sent)
    assert "penalties" in report.markdown(result)


def test_served_sampling_is_the_preset_made_greedy():
    from ninfer_engine.types import SamplingParams

    engine = SimpleNamespace(sampling_defaults=SamplingParams(
        temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5))
    assert engine_step.served_sampling(engine) == SamplingParams(
        temperature=0.0, top_p=0.8, top_k=20, presence_penalty=1.5)


@CPU_ONLY
def test_the_oracle_drafter_takes_the_chosen_drafts(monkeypatch):
    from ninfer_engine.benchmark.forced_drafts import OracleDrafter
    from ninfer_engine.step import postprocess as engine

    oracle = OracleDrafter(2.5, 3, vocab=100, seed=1)  # one or two drafts taken, 1.5 on average
    assert oracle.propose([1, 2], 2) == []  # a round cut short: plain decode
    seen = []
    monkeypatch.setattr(engine, "accept", lambda rows: [[d[0] + 1] for _, d, _ in rows])
    real = engine.accept
    with oracle.forced():
        for _ in range(400):
            drafts = oracle.propose([1, 2], 3)
            (emitted,) = engine.accept([(None, drafts, None)])
            assert emitted[:-1] == drafts[: len(emitted) - 1] and emitted[-1] in drafts + [
                drafts[0] + 1]
            seen.append(len(emitted))
        assert not oracle._taken  # every round settled
        oracle.propose([1, 2], 3)  # a round that never reaches acceptance ...
    assert not oracle._taken  # ... is forgotten with the context
    assert set(seen) == {2, 3} and abs(sum(seen) / len(seen) - 2.5) < 0.1  # ~5σ of 400 draws
    assert engine.accept is real  # restored
    with pytest.raises(ValueError, match="outside"):
        OracleDrafter(4.5, 3, vocab=100)


def _written(**sections) -> dict:
    """A result as `run_decode_bench` writes it, with one batch-1 decode row."""
    return dict(
        machine=dict(device="NVIDIA H200", torch="2.11", triton="3.6", python="3.12",
                     copy_gbps=4000.0, matmul_tflops=790.0),
        command="ninfer bench --arch 35b-a3b", date="2026-12-02T00:00:00+00:00",
        arch="35b-a3b", recipe="bf16", layers=40, weights="random", weight_bytes_per_step=7e9,
        path=run.ENGINE_PATH,
        decode=[dict(context=1024, step_ms=2.0, tok_s=500.0, prefill_ms=80.0, bytes_per_step=7e9,
                     roofline_tok_s=570.0, fraction_of_roofline=500 / 570)], **sections)


def test_markdown_of_a_partial_result_lists_what_was_not_measured():
    result = _written(not_measured={"peer": "skipped (--no-peer)"})
    text = report.markdown(result)
    assert "| 1024 | 500.0 | 2.00 | 80 | 7.00 GB | 570 | 88 % |" in text
    assert "Aggregate" not in text and "Prefill" not in text and "Speculative" not in text
    assert text.rstrip().endswith("Not measured: peer: skipped (--no-peer).")


def test_markdown_renders_moe_concurrency_speculative_and_peer_rows():
    base = _written(not_measured={"prefill": "skipped (--prefill 0)"})
    base["concurrency"] = [dict(concurrency=8, context=1024, step_ms=10.0, tok_s=800.0,
                                per_sequence_tok_s=100.0, experts_read_per_layer=64,
                                experts_expected_per_layer=57.4, bytes_per_step=12e9,
                                bandwidth_roofline_tok_s=2800.0, flop_roofline_tok_s=9e4,
                                roofline_tok_s=2800.0, fraction_of_roofline=800 / 2800)]
    base["speculative"] = [dict(concurrency=1, context=1024, draft_tokens=3,
                                target_tokens_per_round=3.67, tokens_per_round=3.66,
                                acceptance=0.887, tok_s=1200.0, plain_tok_s=500.0, speedup=2.4,
                                policy_tok_s=1190.0, policy_speedup=2.38)]
    base["peer"] = dict(version="5.24.0", prompt_tokens=1024, prefill_tok_s=3714.0,
                        decode_tok_s=9.5, decode_steps=16, ours_decode_tok_s=134.0,
                        ours_context=1024, ratio_decode=134 / 9.5, fla=False)
    text = report.markdown(base)
    assert "| 8 | 1024 | 800.0 | 100.0 | 10.00 | 64 (≈57 expected) | 12.00 GB | 2800 | 90000 " \
           "| 29 % |" in text
    assert ("| 1 | 1024 | 3 | 3.67 → 3.66 | 89 % | 1200.0 | 500.0 | 2.40× | 1190.0 | 2.38× |"
            in text)
    assert "| transformers 5.24.0 | 1024 | 3714 | 9.50 | 134.0 (1024 context) | 14.1× |" in text
    assert "fla False" in text and "Not measured: prefill: skipped (--prefill 0)." in text


def test_cli_passes_every_section_flag(monkeypatch, tmp_path, capsys):
    from ninfer_engine.cli.tools import main

    seen = {}

    def fake(arch, contexts, dtype, layers, command, **kw):
        seen.update(kw, arch=arch, contexts=contexts, command=command)
        return _written(not_measured={})

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(141e9), int(150e9)))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=int(150e9)))
    monkeypatch.setattr(run, "run_decode_bench", fake)
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    assert main(["bench", "--arch", "27b", "--context", "1024", "--concurrency", "1,2",
                 "--prefill", "4096", "--no-peer", "--out", str(out), "--markdown", str(md)]) == 0
    assert seen["concurrency"] == [1, 2] and seen["prefill"] == 4096 and seen["peer"] == "none"
    assert seen["spec_rates"] == [3.67, 2.4] and seen["spec_batches"] == [1, 8]
    assert seen["draft_tokens"] == 3 and "--spec-rates 3.67,2.4" in seen["command"]
    # the chunk is the engine's auto value on this (141-GB) device, and the command says so
    assert seen["prefill_chunk"] == 8192 and seen["concurrency_context"] == 1024
    assert "--prefill-chunk 8192" in seen["command"]
    assert "--concurrency 1,2" in seen["command"] and "--no-peer" in seen["command"]
    assert json.loads(out.read_text())["arch"] == "35b-a3b"
    assert md.read_text() == capsys.readouterr().out
    assert main(["bench", "--arch", "27b", "--concurrency", "none", "--peer", "transformers",
                 "--prefill", "0"]) == 0
    assert seen["concurrency"] == [] and seen["peer"] == "transformers" and seen["prefill"] == 0
    assert main(["bench", "--arch", "27b", "--spec-rates", "5"]) == 1  # > 1 + 3 drafts
    assert seen["spec_drafter"] == "oracle"
    assert main(["bench", "--arch", "27b", "--spec-drafter", "mtp"]) == 0
    assert seen["spec_drafter"] == "mtp" and "--spec-drafter mtp" in seen["command"]
    assert seen["lm_head_draft"] == 0 and "--lm-head-draft" not in seen["command"]
    assert main(["bench", "--arch", "27b", "--spec-drafter", "mtp", "--lm-head-draft",
                 "131072"]) == 0
    assert seen["lm_head_draft"] == 131072 and "--lm-head-draft 131072" in seen["command"]
    assert main(["bench", "--arch", "27b", "--lm-head-draft", "64"]) == 1  # not the oracle's


@CPU_ONLY
def test_a_failing_section_is_recorded_not_fatal(monkeypatch):
    _fake_rates(monkeypatch)

    def boom(*args):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(run, "_prefill", boom)
    result = run.run_decode_bench("tiny-dense", [64], concurrency=[], prefill=96)
    assert [r["context"] for r in result["decode"]] == [64] and "prefill" not in result
    assert result["not_measured"]["engine"].startswith("failed: RuntimeError('CUDA out of")
    assert result["not_measured"]["concurrency"].startswith("skipped")
    assert result["not_measured"]["peer"] == "skipped (--no-peer)"
    assert "failed" not in result


@CPU_ONLY
@torch.inference_mode()
def test_forced_rounds_draft_with_the_mtp_head_and_take_the_chosen_count():
    """`bench_engine(..., mtp_params=...)` serves `--spec mtp` over the random head the
    synthetic source draws; `ForcedRounds` keeps the head's drafting and forces how many of
    its drafts a round takes (random weights accept ~none), so rounds average the chosen
    count as `OracleDrafter`'s do."""
    from ninfer_engine.artifact.synth import build_synthetic
    from ninfer_engine.models.qwen3_5 import Qwen35Model
    from ninfer_engine.step.mtp_drafter import MtpDrafter
    from ninfer_engine.step.spec_policy import AlwaysSpeculate

    config, source = build_synthetic("tiny-moe", "cpu", torch.float32, mtp=True)
    model = Qwen35Model(config, source)
    engine = engine_step.bench_engine(model, "tiny-moe", config, 1, 256, draft_tokens=3,
                                      mtp_params=source)
    try:
        head = engine.speculator.drafter
        assert isinstance(head, MtpDrafter) and engine.speculator.reads_hidden
        forced = forced_drafts.ForcedRounds(head, 3.5, 3, seed=2)  # two or three drafts taken
        drafted = []
        real = head.propose_rows
        head.propose_rows = lambda seqs, ks: drafted.append(real(seqs, ks)) or drafted[-1]
        engine.speculator.drafter, engine.speculator.policy = forced, AlwaysSpeculate()
        with forced.forced():
            run = engine_step.run_requests(
                engine, engine_step.random_prompts(1, 40, config["vocab_size"]), 120)
            assert not forced._taken  # every forced round reached acceptance
        stats = engine.speculator.stats()
    finally:
        engine.stop()
    assert sum(run.emitted) == 120 and drafted
    full = sum(len(d) == 3 for rows in drafted for d in rows)  # the head's full rounds
    # every full round is verified and forced (shorter ones decode plainly), taking 2 or 3
    assert stats.rounds == full > 20 and 2 * full <= stats.accepted <= 3 * full
    assert abs(stats.accepted / full - 2.5) < 0.45  # mean 2.5, σ 0.5 / √full ≤ 0.11


@CPU_ONLY
def test_the_speculative_section_drafts_with_the_mtp_head(monkeypatch):
    """`--spec-drafter mtp`: the section's rounds are the MTP head's drafts, their count forced
    (3 tokens a round at k = 3: two of three taken, every round), and the report says so."""
    _fake_rates(monkeypatch, True)
    result = run.run_decode_bench("tiny-moe", [60], command="ninfer bench", concurrency=[1],
                                  concurrency_context=50, spec_rates=[3.0], spec_batches=[1],
                                  spec_drafter="mtp")
    (spec,) = result["speculative"]
    assert result["spec_drafter"] == "mtp" and spec["tokens_per_round"] == 3.0
    assert spec["acceptance"] == pytest.approx(2 / 3) and spec["policy_tok_s"] > 0
    text = report.markdown(result)
    assert "verify rows with the MTP head's drafts" in text and "ForcedRounds" in text
    assert result["lm_head_draft"] == 0 and "--lm-head-draft" not in text


@CPU_ONLY
def test_the_mtp_section_drafts_over_a_proposal_of_the_head(monkeypatch):
    """`--lm-head-draft ROWS`: the engine the section drafts with is `--lm-head-draft` over
    the head's first ROWS rows, and the report names it."""
    _fake_rates(monkeypatch, True)
    built = []
    real = run.bench_engine
    monkeypatch.setattr(run, "bench_engine", lambda *a, **kw: built.append(kw) or real(*a, **kw))
    result = run.run_decode_bench("tiny-moe", [60], command="ninfer bench", concurrency=[1],
                                  concurrency_context=50, spec_rates=[3.0], spec_batches=[1],
                                  spec_drafter="mtp", lm_head_draft=96)
    (spec,) = result["speculative"]
    assert built[0]["lm_head_draft"] == 96 and built[0]["mtp_params"] is not None
    assert result["lm_head_draft"] == 96 and spec["tokens_per_round"] == 3.0
    assert "the argmax over its first 96 rows" in report.markdown(result)
