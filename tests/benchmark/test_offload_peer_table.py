"""`bench/offload_peer_table.py` pairs each llama.cpp `-ncmoe N` run with ours at the nearest
share of routed experts off the device, and divides the right rates."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("offload_peer_table",
                                                  ROOT / "bench" / "offload_peer_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _llama(n: int, rate: float) -> list[dict]:
    return [dict(n_cpu_moe=n, avg_ts=rate, stddev_ts=1.0, build_commit="0c1e57098",
                 model_type="qwen35moe", model_size=2**30, n_threads=16, cpu_info="cpu",
                 gpu_info="gpu", n_gen=64, flash_attn=1)]


def _ours() -> dict:
    rows = [dict(routing=routing, host_share=share, batch=batch, tok_s=rate,
                 path="tier (auto), graph step" if share else "all stacked, graph step")
            for routing, share, batch, rate in (
                ("uniform", 0.0, 1, 1000.0), ("skewed", 0.0, 1, 990.0),
                ("uniform", 0.5, 1, 150.0), ("skewed", 0.5, 1, 500.0),
                ("uniform", 0.5, 8, 190.0), ("uniform", 0.8, 1, 100.0),
                ("skewed", 0.8, 1, 280.0))]
    return dict(date="d", command="c", layers=16, rows=rows,
                machine=dict(device="gpu", torch="2", h2d_gbps=55.0))


def test_each_ncmoe_run_meets_ours_at_the_nearest_share(tmp_path):
    tool = _tool()
    out = tool.build(_ours(), [_llama(13, 114.0), _llama(0, 470.0), _llama(8, 156.0)], 16)
    pairs = [(r["n_cpu_moe"], r["ours_share"], r["ours_uniform_tok_s"], r["ours_skewed_tok_s"])
             for r in out["rows"]]
    assert pairs == [(0, 0.0, 1000.0, 990.0), (8, 0.5, 150.0, 500.0), (13, 0.8, 100.0, 280.0)]
    assert out["rows"][1]["ratio_uniform"] == 150.0 / 156.0
    assert out["rows"][2]["ratio_skewed"] == 280.0 / 114.0
    text = tool.markdown(out, None)
    assert "| 8 of 16 | 50% / 50% | 156.0 ± 1.0 | 150.0 | 0.96 | 500.0 | 3.21 |" in text
    json.dumps(out)  # what --out writes


def test_a_cpu_share_picks_our_rows_with_it_and_the_all_on_device_rows():
    """`--cpu-share 0.5`: at a share off the device, our rows run with `--expert-cpu-share
    0.5` (not the bus-only rows of the same call); at 0 %, the all-on-device rows (which have
    none)."""
    tool = _tool()
    ours = _ours()
    ours["rows"] += [dict(routing=routing, host_share=0.5, batch=1, tok_s=rate,
                          cpu_share_asked=0.5, path="tier (auto, CPU 0.50), graph step")
                     for routing, rate in (("uniform", 270.0), ("skewed", 560.0))]
    out = tool.build(ours, [_llama(0, 470.0), _llama(8, 156.0)], 16, 0.5)
    pairs = [(r["ours_uniform_tok_s"], r["ours_skewed_tok_s"]) for r in out["rows"]]
    assert pairs == [(1000.0, 990.0), (270.0, 560.0)] and out["ours_cpu_share"] == 0.5
    assert "--expert-cpu-share 0.5" in tool.markdown(out, None)
    bus_only = tool.build(ours, [_llama(8, 156.0)], 16)
    assert bus_only["rows"][0]["ours_uniform_tok_s"] == 150.0
