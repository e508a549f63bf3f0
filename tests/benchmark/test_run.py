"""`ninfer bench` orchestration on the CPU: CUDA timing faked, the tiny model run for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ninfer_engine.benchmark import run
from ninfer_engine.kernels._dispatch import HAVE_TRITON, interpreting
from tests.benchmark.tiny import tiny_config, tiny_source

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


class _Graph:
    def __init__(self, fn):
        self.replay = fn


def _fake_cuda(monkeypatch, moe: bool, calls: list):
    config = tiny_config(moe)
    monkeypatch.setattr(run, "build_synthetic",
                        lambda arch, dev, dtype, layers: (config, tiny_source(config)))
    monkeypatch.setattr(run, "copy_bandwidth_gbps", lambda: 4000.0)
    monkeypatch.setattr(run, "matmul_tflops", lambda: 800.0)
    monkeypatch.setattr(run, "graph_of", _Graph)

    def timed(fn, n, warm_up=True):
        fn()  # one real call (the interpreter is slow); every timing reads 2 ms
        calls.append(n)
        return 2.0

    monkeypatch.setattr(run, "time_ms", timed)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return config


CPU_ORCHESTRATION = pytest.mark.skipif(
    not HAVE_TRITON or torch.cuda.is_available() or not interpreting(),
    reason="the CPU orchestration check runs under TRITON_INTERPRET=1")


@CPU_ORCHESTRATION
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_bench_sections_on_the_cpu(monkeypatch, moe):
    calls = []
    config = _fake_cuda(monkeypatch, moe, calls)
    peers = []

    def fake_peer(cfg, prompt, steps):
        peers.append((cfg, prompt, steps))
        return dict(library="transformers", version="x", prompt_tokens=prompt, decode_steps=steps,
                    prefill_tok_s=1000.0, decode_tok_s=50.0, attn_implementation="sdpa")

    monkeypatch.setattr("ninfer_engine.benchmark.peer.run_peer", fake_peer)
    result = run.run_decode_bench("tiny", [100], command="ninfer bench", concurrency=[1, 3],
                                  concurrency_context=70, prefill=96, prefill_chunk=64,
                                  peer="transformers", peer_prompt=96, peer_steps=4)
    json.dumps(result)  # JSON-able
    assert [r["context"] for r in result["decode"]] == [100]
    assert result["decode"][0]["tok_s"] == 500.0
    conc = result["concurrency"]
    assert [(r["concurrency"], r["tok_s"]) for r in conc] == [(1, 500.0), (3, 1500.0)]
    for r in conc:
        assert r["roofline_tok_s"] == min(r["bandwidth_roofline_tok_s"], r["flop_roofline_tok_s"])
        assert r["fraction_of_roofline"] == pytest.approx(r["tok_s"] / r["roofline_tok_s"])
    assert conc[1]["bytes_per_step"] > conc[0]["bytes_per_step"]
    assert ("experts_read_per_layer" in conc[0]) == moe
    pre = result["prefill"]
    assert pre["tokens"] == 96 and pre["chunks"] == 2 and pre["tok_s"] == 96 * 1e3 / 2.0
    assert pre["fraction_of_roofline"] == pytest.approx(pre["tok_s"] / pre["roofline_tok_s"])
    assert peers == [(config, 96, 4)]
    peer = result["peer"]
    assert peer["ratio_decode"] == pytest.approx(500.0 / 50.0) and peer["ours_context"] == 100
    assert peer["ratio_prefill"] == pytest.approx(pre["tok_s"] / 1000.0)
    assert result["not_measured"] == {}
    text = run.markdown(result)
    for heading in ("Batch-1 decode", "Aggregate decode", "Prefill of a 96-token", "Peer:"):
        assert heading in text
    assert "Not measured" not in text and "| 10.0× |" in text


def test_markdown_of_a_partial_result_lists_what_was_not_measured():
    result = json.loads((RESULTS / "h200-ninfer-bench-27b.json").read_text())
    for section in ("concurrency", "prefill", "peer"):  # as a decode-only run writes it
        result.pop(section, None)
    result["not_measured"] = {"peer": "skipped (--no-peer)"}
    text = run.markdown(result)
    first = result["decode"][0]
    assert f"| {first['context']} | {first['tok_s']:.1f} | {first['graph_step_ms']:.2f} |" in text
    assert "Aggregate" not in text and "Prefill" not in text
    assert text.rstrip().endswith("Not measured: peer: skipped (--no-peer).")


def test_markdown_renders_moe_concurrency_and_peer_rows():
    base = json.loads((RESULTS / "h200-ninfer-bench-35b-a3b.json").read_text())
    base["machine"]["matmul_tflops"] = 790.0
    base["concurrency"] = [dict(concurrency=8, context=1024, graph_step_ms=10.0, tok_s=800.0,
                                per_sequence_tok_s=100.0, experts_read_per_layer=64,
                                experts_expected_per_layer=57.4, bytes_per_step=12e9,
                                bandwidth_roofline_tok_s=2800.0, flop_roofline_tok_s=9e4,
                                roofline_tok_s=2800.0, fraction_of_roofline=800 / 2800)]
    base["peer"] = dict(version="5.24.0", prompt_tokens=1024, prefill_tok_s=3714.0,
                        decode_tok_s=9.5, decode_steps=16, ours_decode_tok_s=134.0,
                        ours_context=1024, ratio_decode=134 / 9.5, fla=False)
    base["not_measured"] = {"prefill": "skipped (--prefill 0)"}
    text = run.markdown(base)
    assert "| 8 | 1024 | 800.0 | 100.0 | 10.00 | 64 (≈57 expected) | 12.00 GB | 2800 | 90000 " \
           "| 29 % |" in text
    assert "| transformers 5.24.0 | 1024 | 3714 | 9.50 | 134.0 (1024 context) | 14.1× |" in text
    assert "fla False" in text and "Not measured: prefill: skipped (--prefill 0)." in text


def test_cli_passes_every_section_flag(monkeypatch, tmp_path, capsys):
    from ninfer_engine.cli.tools import main

    seen = {}

    def fake(arch, contexts, dtype, layers, command, **kw):
        seen.update(kw, arch=arch, contexts=contexts, command=command)
        return json.loads((RESULTS / "h200-ninfer-bench-27b.json").read_text())

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(141e9), int(150e9)))
    monkeypatch.setattr(run, "run_decode_bench", fake)
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    assert main(["bench", "--arch", "27b", "--context", "1024", "--concurrency", "1,2",
                 "--prefill", "4096", "--no-peer", "--out", str(out), "--markdown", str(md)]) == 0
    assert seen["concurrency"] == [1, 2] and seen["prefill"] == 4096 and seen["peer"] == "none"
    assert seen["prefill_chunk"] == 4096 and seen["concurrency_context"] == 1024
    assert "--concurrency 1,2" in seen["command"] and "--no-peer" in seen["command"]
    assert json.loads(out.read_text())["arch"] == "27b"
    assert md.read_text() == capsys.readouterr().out
    assert main(["bench", "--arch", "27b", "--concurrency", "none", "--peer", "transformers",
                 "--prefill", "0"]) == 0
    assert seen["concurrency"] == [] and seen["peer"] == "transformers" and seen["prefill"] == 0


@CPU_ORCHESTRATION
def test_a_failing_section_is_recorded_not_fatal(monkeypatch):
    calls = []
    _fake_cuda(monkeypatch, False, calls)

    def boom(*args):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(run, "_prefill", boom)
    result = run.run_decode_bench("tiny", [64], concurrency=[], prefill=96)
    assert [r["context"] for r in result["decode"]] == [64] and "prefill" not in result
    assert result["not_measured"]["prefill"].startswith("failed: RuntimeError('CUDA out of")
    assert result["not_measured"]["concurrency"].startswith("skipped")
    assert result["not_measured"]["peer"] == "skipped (--no-peer)"
    assert "failed" not in result
