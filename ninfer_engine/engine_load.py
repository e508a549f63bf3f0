"""`load_engine`: an artifact turned into the parts a serving `Engine` runs (tokenizer, chat
template, this rank's model and memory, its captured graphs, speculator and vision tower);
`engine_runner`: the runner over them.

Any failure becomes one `EngineLoadError` that names the artifact (startup exit 1); when the
payload digest check fails too, its mismatch is the reason given.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .chat import ChatTemplate
from .config import EngineConfig
from .cpu_threads import run_on_own_thread
from .experts import expert_tiers_for, offloading
from .parallel import RankGroup
from .parallel.lockstep import Leader, LeaderDrafter
from .rank_parts import load_rank
from .serving import (cpu_compiled, prefill_chunk_for, serving_device, serving_dtypes,
                      weights_mode)
from .step.families import make_runner
from .step.speculation import build_speculator
from .step.verify_chain import verify_chain
from .tokenizer import Tokenizer
from .vision.tower import VisionTower, load_vision

log = logging.getLogger("ninfer.engine")


class EngineLoadError(RuntimeError):
    """The artifact could not be turned into a serving engine (startup error, exit 1)."""


@dataclass(frozen=True)
class LoadedEngine:
    artifact: Any
    text_config: dict
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    config: EngineConfig  # with the resolved `--kv-capacity`
    device: Any  # the torch.device it serves on
    model: Any
    memory: Any
    graphs: Any  # the captured decode graphs, or None
    speculator: Any  # `--spec`'s, or None
    vision: VisionTower | None


def load_engine(config: EngineConfig, artifact: Any, model: Any, ranks: RankGroup,
                vision: VisionTower | None) -> LoadedEngine:
    """`Engine.__init__`'s arguments (see there) loaded; raises `EngineLoadError`."""
    check = None  # the payload digest check of an artifact opened here
    try:
        if artifact is None:
            from .artifact import open_artifact
            from .artifact.verify import BackgroundCheck, recorded_digest

            artifact = open_artifact(config.artifact)
            if not config.no_verify and recorded_digest(artifact) is not None:
                # hashed on its own thread while the weights load; a mismatch closes the
                # artifact, which stops the load at its next read
                check = BackgroundCheck(artifact, on_mismatch=artifact.close)
        text_config = artifact.config("text")
        tokenizer = Tokenizer.from_artifact(artifact)
        chat_template = ChatTemplate.from_artifact(
            artifact, config.chat_template, tokenizer.bos_token, tokenizer.eos_token)
        device = serving_device(config)
        dtype, matmul = serving_dtypes(config, device)

        offloading(config, text_config)  # an expert budget for a dense model is an error
        towers = [vision]

        def with_model(built, weights):  # weights: this rank's share (tensor parallel)
            towers[0] = vision or load_vision(config, artifact, built, tokenizer, dtype)
            if not config.spec:
                return None
            return build_speculator(config.spec, config.draft_tokens, weights, built,
                                    tokenizer.vocab_size, matmul, config.lm_head_draft)

        def load():
            return load_rank(config, artifact, device, dtype, matmul,
                             weights_mode(config, device, dtype, artifact),
                             prefill_chunk_for(config, device), ranks, model,
                             expert_tiers=lambda text, source: expert_tiers_for(
                                 config, text, source, device, dtype),
                             with_model=with_model,
                             step_weights=artifact if cpu_compiled(config) and model is None
                             else None)

        # on the CPU the step thread must own the only OpenMP team (`cpu_threads`)
        parts = run_on_own_thread(load) if device.type == "cpu" else load()
        if check is not None:
            check.result()  # a corrupt payload refuses to serve
            log.info("payload digest verified (%.2f s): %s", check.seconds, config.artifact)
    except Exception as exc:
        if check is not None:  # a corrupt payload explains any load error: say that
            try:
                check.result()
            except Exception as mismatch:
                raise EngineLoadError(str(mismatch)) from exc
        message = str(exc)
        if str(config.artifact) not in message:  # artifact errors already name the file
            message = f"cannot load {config.artifact}: {message}"
        raise EngineLoadError(message) from exc
    return LoadedEngine(artifact, text_config, tokenizer, chat_template, parts.config,
                        device, parts.model, parts.memory, parts.graphs, parts.extra, towers[0])


def engine_runner(loaded: LoadedEngine, ranks: RankGroup, eos: frozenset[int],
                  served: tuple) -> Any:
    """The family's runner over `loaded`'s model and graphs; under `--spec mtp` with its verify
    chain (`served`: the sampling presets a request that sends none samples with, whose chains
    are captured at start); under tensor parallelism wrapped by the `Leader` that sends each
    step's plan to the other ranks before it runs here."""
    spec = loaded.speculator
    # hiddens go to a drafter that reads them (MTP); without one the graph step keeps none
    runner = make_runner(loaded.model, loaded.graphs,
                         spec.observe if spec and spec.reads_hidden else None, loaded.vision)
    if not ranks.parallel:
        if loaded.config.verify_chain:
            runner.chain = verify_chain(loaded.graphs, spec, eos, served)
        return runner
    runner = Leader(runner, ranks, loaded.memory, spec.observes if spec else None)
    if spec and hasattr(spec.drafter, "propose_rows"):  # the other ranks draft too
        spec.drafter = LeaderDrafter(spec.drafter, runner)
    return runner
