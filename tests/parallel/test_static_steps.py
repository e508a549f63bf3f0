"""The static decode steps the CUDA graphs capture, at `--tp 2` over gloo on the CPU: each rank
runs them over its share (the llama step through the kernels' torch references, the hybrid step
through the Triton interpreter) with the all-reduces inside, against the same ranks' eager
forward. Slow (two processes, the interpreter): `pytest -m slow tests/parallel`."""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from .ranks import collect

# the logits of two fp32 paths over the same shares differ by summation order only (~1e-6 of
# their scale at these depths); a missing or doubled all-reduce moves them by O(1)
FP32_TOL = 1e-4


def _llama(ranks) -> None:
    from ninfer_engine.models import build_model
    from ninfer_engine.models.llama_step import StaticDecoder
    from ninfer_engine.parallel import shard_for_rank
    from ninfer_engine.step.decode_graphs import DecodeGraphs
    from tests.engine.helpers import DictWeights, text_config, tiny_llama
    from tests.engine.test_decode_graphs import _eager_step, _prefilled, _storage

    hf = tiny_llama(vocab_size=131)
    config, weights = shard_for_rank(text_config(hf), DictWeights.from_hf(hf), ranks)
    model = build_model(config, weights, "cpu", torch.float32, ranks=ranks)
    prompts = [list(range(3, 3 + n)) for n in (5, 63, 64)]
    ours_storage, ref_storage = _storage(model, "bf16"), _storage(model, "bf16")
    ours = [_prefilled(model, ours_storage, p) for p in prompts]
    ref = [_prefilled(model, ref_storage, p) for p in prompts]
    graphs = DecodeGraphs(StaticDecoder(model, ours_storage, 3, 512), capture=False)
    for _ in range(4):
        for seq in ours:
            assert seq.cache.reserve(seq.cached + 1)
        got, want = graphs.forward(ours), _eager_step(model, ref)
        assert got.shape == (3, 131)
        assert (got - want).abs().max() <= FP32_TOL * want.abs().max()
        for a, b, row in zip(ours, ref, want):
            a.output.append(int(row.argmax()))
            b.output.append(int(row.argmax()))


def _hybrid(ranks) -> None:
    from ninfer_engine.artifact.synth import build_synthetic
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5 import Qwen35Model
    from ninfer_engine.parallel import shard_for_rank
    from tests.hybrid_step_harness import StepHarness
    from tests.kernels.conftest import rel_err
    from tests.kernels.test_decode_stack import TOL

    class Draws:
        def __init__(self, source):
            self.source = source

        def parameter(self, name, shape, dtype=None):
            return self.source(name, tuple(shape))

    torch.manual_seed(0)
    config, source = build_synthetic("tiny-dense", "cpu", torch.bfloat16)
    config, sharded = shard_for_rank(config, Draws(source), ranks)
    params = FusedParams(config, lambda name, shape: sharded.parameter(name, shape))
    model = Qwen35Model(config, params, ranks=ranks)
    state = model.new_state()
    model.forward(torch.randint(0, 1000, (70,), generator=torch.Generator().manual_seed(1)),
                  state)
    dec = StepHarness(model, params, 192)
    dec.load_state(state)
    tok = torch.tensor([1234])
    for _ in range(2):
        ref = model.forward(tok, state, last_only=True)
        dec.token.copy_(tok)
        out = dec.step(dec.token)
        assert rel_err(out, ref) < TOL
        tok = ref.argmax(-1)


def _rank(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", TRITON_INTERPRET="1")
    torch.set_num_threads(1)
    from ninfer_engine.parallel import join_from_env

    ranks = join_from_env(torch.device("cpu"))
    for name, check in (("llama", _llama), ("hybrid", _hybrid)):
        try:
            with torch.inference_mode():
                check(ranks)
            results.put((rank, name, None))
        except Exception as exc:  # reported to the test; the peer then fails its collective
            results.put((rank, name, repr(exc)))
            raise


@pytest.mark.slow
def test_static_decode_steps_all_reduce_like_the_eager_forward():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, results)) for r in range(2)]
    got = collect(procs, results, 4, 300)
    assert sorted(got) == [(0, "hybrid", None), (0, "llama", None),
                           (1, "hybrid", None), (1, "llama", None)]
