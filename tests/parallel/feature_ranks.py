"""`--spec mtp` and `--vision` at `--tp 2` for the tests: spawned gloo ranks (rank 0 an `Engine`,
rank 1 a `Follower`) and the same runs at tp1, each stepped by hand (`Engine.step`) so both
give the same steps, hence the same drafting rounds, whatever the machine's timing."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import torch.multiprocessing as mp

from ninfer_engine.config import EngineConfig
from ninfer_engine.types import GenerationRequest, SamplingParams

from .ranks import PROMPTS, collect

GREEDY = SamplingParams(temperature=0.0)
# (family, --tp-experts): the MTP layer sharded by intermediate, and its routed experts by id
MTP_CASES = (("qwen3_5", "intermediate"), ("qwen3_5_moe", "expert"))
MTP_TOKENS = 16
VISION_TOKENS = 8
PROFILES = ("flash-next", "27b")
# the prefix cache at tp 2: llama (page tails copied) and qwen3_5 (state snapshots, host tier)
PREFIX_CASES = ("llama", "qwen3_5")


def mtp_config(experts: str, spec: str | None = "mtp") -> EngineConfig:
    # prefix reuse off: these are the drafts' tests (the prefix cache's: `PREFIX_CASES`)
    return EngineConfig(artifact=Path("tiny.ninfer"), prefill_chunk=8, max_context=256,
                        max_concurrency=2, tp_experts=experts, spec=spec,
                        draft_tokens=3 if spec else None, no_prefix_reuse=True)


def vision_config(path: Path) -> EngineConfig:
    # prefill chunks of 16 cut through the image's 30 pads
    return EngineConfig(artifact=path, vision=True, max_context=512, prefill_chunk=16,
                        max_concurrency=2, no_prefix_reuse=True)


def stepped(engine, prompts, max_tokens: int, media=None) -> list[list[int]]:
    """Every prompt queued at once (request ids r0, r1, ..), then `Engine.step` until all end:
    each request's greedy tokens."""
    out: list[list[int]] = [[] for _ in prompts]
    ended = []
    for i, prompt in enumerate(prompts):
        def emit(event, i=i):
            out[i].extend(event.token_ids)
            if event.finish is not None:
                ended.append((i, event.finish, event.error))
        engine.add(GenerationRequest(f"r{i}", tuple(prompt), GREEDY, max_tokens,
                                     ignore_eos=True, media=media and media[i]), emit)
    while len(ended) < len(prompts):
        assert engine.step() or len(ended) == len(prompts), "the engine stalled"
    assert all(finish == "length" for _, finish, _ in ended), ended
    return out


# each profile's flags as the manual expands them, sized for the CPU (the host KV tier, the
# context); the ranks are the test's gloo processes, not `--devices 0,1`
PROFILE_SIZES = ("--max-context", "2048", "--host-kv-mib", "1", "--kv-grow", "1024")


def profile_config(profile: str, path: Path) -> EngineConfig:
    from ninfer_engine.cli.flags import parse_args

    sizes = PROFILE_SIZES[:4] if profile == "27b" else PROFILE_SIZES[:2] + PROFILE_SIZES[4:]
    return parse_args([str(path), "--profile", profile, *sizes]).config


def profile_engine(profile: str, path: Path, ranks=None):
    """An engine of `profile`'s flags over the tiny artifact at `path` (flash-next: the MoE
    family with an MTP head; 27b: a multimodal dense one with an MTP head), drafting every
    step."""
    from ninfer_engine.engine import Engine
    from ninfer_engine.parallel import SINGLE
    from ninfer_engine.step.spec_policy import AlwaysSpeculate

    artifact = None
    if profile == "flash-next":
        from tests.engine.test_mtp_speculation import MtpArtifact

        artifact = MtpArtifact("qwen3_5_moe")
    engine = Engine(profile_config(profile, path), artifact, ranks=ranks or SINGLE)
    engine.speculator.policy = AlwaysSpeculate()
    return engine


def profile_run(profile: str, engine) -> tuple:
    """(tokens of two requests, MTP rounds, host tier bytes): with an image each under 27b."""
    if profile == "27b":
        prompts, media = image_requests(engine)
    else:
        prompts, media = PROMPTS, None
    tokens = stepped(engine, prompts, VISION_TOKENS, media)
    return tokens, engine.speculator.counters.rounds, engine.memory.host_tier_bytes()


def write_vl_mtp_artifact(folder: Path) -> Path:
    """`ninfer convert hf` of the tiny multimodal qwen3_5 with an MTP head (`mtp.*`)."""
    from safetensors.torch import save_file

    from ninfer_engine.cli.tools import main
    from tests.models.mtp_tiny import HfMtp
    from tests.vision.tiny_vl import hf_vl_model, vl_resources

    checkpoint = folder / "checkpoint"
    hf_vl_model("qwen3_5").save_pretrained(checkpoint, safe_serialization=True)
    for role, data in vl_resources().items():
        (checkpoint / role).write_bytes(data)
    mtp = {f"mtp.{k}": t.contiguous() for k, t in HfMtp("qwen3_5").checkpoint().items()}
    save_file(mtp, checkpoint / "mtp.safetensors")
    out = folder / "vl-mtp.ninfer"
    assert main(["convert", "hf", str(checkpoint), "-o", str(out), "--recipe", "fp32"]) == 0
    return out


def prefix_config() -> EngineConfig:
    # a 4-page pool for a 3-page prompt (so the tree demotes pages to the host tier), snapshots
    # every 16 tokens and two device snapshot slots (so snapshots move to host slots)
    return EngineConfig(artifact=Path("tiny.ninfer"), prefill_chunk=16, max_context=256,
                        max_concurrency=1, host_kv_mib=1, host_state_slots=2,
                        device_state_slots=2)


def prefix_run(engine) -> tuple:
    """A 150-token prompt, the same again, then it with more after: (each one's tokens, prefix
    hits, tokens restored, the tree's (pages evicted, snapshots on the host))."""
    first = tuple((i * 7) % 100 + 3 for i in range(150))
    out = [stepped(engine, [p], 6)[0] for p in (first, first, first + (7, 8, 9, 10, 11))]
    tree = engine.memory.prefix
    return (out, engine.memory.hits, engine.memory.hit_tokens,
            (tree.evicted, tree.host_snapshots))


def mtp_engine(family: str, experts: str, want: dict, ranks=None):
    """An `--spec mtp` engine drafting every step, its drafts steered (`Steered`: every
    acceptance length occurs) towards `want`, the plain run's tokens by request id."""
    from ninfer_engine.engine import Engine
    from ninfer_engine.parallel import SINGLE
    from ninfer_engine.step.spec_policy import AlwaysSpeculate
    from tests.engine.steered import Steered
    from tests.engine.test_mtp_speculation import MtpArtifact

    engine = Engine(mtp_config(experts), MtpArtifact(family), ranks=ranks or SINGLE)
    engine.speculator.policy = AlwaysSpeculate()  # the same rounds at tp1 and tp2
    engine.speculator.drafter = Steered(engine.speculator.drafter, want,
                                         engine.model.vocab_size)
    return engine


def mtp_result(engine, tokens) -> tuple:
    c = engine.speculator.counters
    return (tokens, (c.rounds, c.drafted, c.accepted, tuple(c.per_position)),
            engine.speculator.drafter.proposed)


def plain_mtp_run(family: str) -> dict:
    """The tp1 greedy tokens without drafts, by request id."""
    from ninfer_engine.engine import Engine
    from tests.engine.test_mtp_speculation import MtpArtifact

    engine = Engine(mtp_config("intermediate", None), MtpArtifact(family))
    try:
        return {f"r{i}": t for i, t in enumerate(stepped(engine, PROMPTS, MTP_TOKENS))}
    finally:
        engine.stop()


def image_requests(engine) -> tuple[list, list]:
    """Two prompts with an image each (different images) and their media."""
    from tests.vision.media_samples import png
    from tests.vision.tiny_vl import IMAGE_PAD, VISION_END, VISION_START
    from ninfer_engine.vision.decode import image_item

    vision, prompts, media = engine.media_planner, [], []
    for n, (w, h) in enumerate(((40, 56), (24, 48))):
        ids = [*b"Look ", VISION_START, IMAGE_PAD, VISION_END, *b" and tell"]
        expanded, m = vision.prepare(ids, [image_item(png(w, h, n + 1), vision.preprocessor)],
                                     engine.tokenizer.encode)
        prompts.append(expanded)
        media.append(m)
    return prompts, media


def _rank(rank: int, world: int, port: int, wants: dict, paths: dict, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    import torch

    torch.set_num_threads(1)  # two ranks on a small CI box
    from ninfer_engine.artifact import open_artifact
    from ninfer_engine.engine import Engine
    from ninfer_engine.parallel import join_from_env
    from ninfer_engine.parallel.follower import Follower
    from tests.engine.test_mtp_speculation import MtpArtifact

    ranks = join_from_env(torch.device("cpu"))
    from .ranks import artifact

    for family in PREFIX_CASES:
        if rank:
            Follower(prefix_config(), artifact(family), ranks).run()
            continue
        engine = Engine(prefix_config(), artifact(family), ranks=ranks)
        try:
            results.put((f"prefix-{family}", prefix_run(engine)))
        finally:
            engine.stop()
    for family, experts in MTP_CASES:
        if rank:
            Follower(mtp_config(experts), MtpArtifact(family), ranks).run()
            continue
        engine = mtp_engine(family, experts, wants[family], ranks)
        try:
            results.put((family, mtp_result(engine, stepped(engine, PROMPTS, MTP_TOKENS))))
        finally:
            engine.stop()
    if rank:
        Follower(vision_config(paths["vision"]), open_artifact(paths["vision"]), ranks).run()
    else:
        engine = Engine(vision_config(paths["vision"]), ranks=ranks)
        try:
            prompts, media = image_requests(engine)
            results.put(("vision", stepped(engine, prompts, VISION_TOKENS, media)))
        finally:
            engine.stop()
    for profile in PROFILES:
        if rank:
            artifact = (MtpArtifact("qwen3_5_moe") if profile == "flash-next"
                        else open_artifact(paths[profile]))
            Follower(profile_config(profile, paths[profile]), artifact, ranks).run()
            continue
        engine = profile_engine(profile, paths[profile], ranks)
        try:
            results.put((profile, profile_run(profile, engine)))
        finally:
            engine.stop()


def run_feature_ranks(wants: dict, paths: dict, timeout: float = 240.0) -> dict:
    """Rank 0's results by case: each MTP family's (tokens, counters, proposals), "vision"'s
    tokens, each profile's `profile_run`; `paths`: the artifacts of "vision" and the
    profiles."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, wants, paths, results))
             for r in range(2)]
    return dict(collect(procs, results,
                        len(PREFIX_CASES) + len(MTP_CASES) + 1 + len(PROFILES), timeout))
