"""`ninfer-serve`: the entry point and composition root.

Parses and validates the command line, checks that every requested feature can run here, then
starts either the Textual console (a TTY) or the headless server. Exit codes: 0 on SIGINT or
SIGTERM (after a graceful drain, `--drain-timeout-ms`), 1 for any startup failure, 2 after an
engine-wide failure in headless mode.
"""
from __future__ import annotations

import sys

from ninfer_engine.cli.capabilities import FeatureUnavailable, check_features, probe_machine
from ninfer_engine.cli.flag_table import USAGE
from ninfer_engine.cli.flag_values import UsageError
from ninfer_engine.cli.flags import parse_args

HELP = f"""{USAGE}

Serve one NInfer .ninfer artifact over OpenAI Chat Completions, OpenAI Responses and
Anthropic Messages. Without an artifact path the default model prepared by install.sh is
served. In a terminal an operator console opens; --no-tui (or no TTY) runs headless.

Profiles (expanded right after the artifact path; later flags win):
  --profile flash-next   --tp 2 --devices 0,1 --kv-dtype int8 --elastic --max-context 262144
                         --max-concurrency 1 --spec mtp --draft-tokens 3
  --profile 27b          --tp 2 --devices 0,1 --kv-dtype int8 --max-context 196608
                         --device-state-slots 4 --max-concurrency 1 --spec mtp --draft-tokens 3
                         --vision --vision-device 0 --max-vision-tokens 4096
                         --host-state-slots 8 --host-kv-mib 8192

Network:   --host H (127.0.0.1)  --port N (8080)  --api-key KEY  --model-id ID  --cors
           --max-request-mib N (384)
Capacity:  --max-context N (8192)  --kv-capacity N|auto  --max-concurrency 1..8 (1)
           --max-pending-requests N (16)  --pending-timeout-ms N (30000)
           --drain-timeout-ms N (10000: on quit or SIGTERM, running requests get this long)
           --prefill-chunk N|auto (4096 CUDA, 1024 CPU)  --kv-lease-window N (4096)
           --kv-dtype bf16|int8|fp8|nvfp4|k8v4  --elastic  --kv-grow N  --kv-budget-gib G
           --vram-headroom-mib N
Devices:   --tp 1|2  --devices A,B  --device N  --no-cuda-graph  --embedding-host
           --no-tp-mailbox  --tp-experts intermediate|expert (intermediate; expert: each
           rank a share of the routed experts, eager decode)  --cpu-step compiled|eager
           (compiled, where available: CPU decode in one C call a step over the artifact's Q8
           weights; else eager, the reason logged)
           --cpu-matmul fp32|bf16|int8 (fp32; bf16 and int8 narrow the eager step's
           projections, int8 per row at load)
           --cuda-dtype bf16|fp32 (bf16; fp32 is the exact, slower path)
           --cuda-weights auto|packed|dequant (auto: each format in its fastest form)
           --prefill-activations fp8|bf16 (fp8: prompt steps' fp8-row experts multiply e4m3
           activations in fp8 MMAs; decode rows keep bf16)
Experts:   --expert-vram-mib F|auto (device memory for routed experts; the rest in host RAM,
           cached in device slots; default: all on the device)
           --expert-miss auto|read|copy|cpu (read: the CUDA-graph step reads misses in place
           from host RAM and caches them between steps; copy/cpu: an uncaptured step that copies
           or computes each miss on the CPU; auto: read where the experts' form allows, else by
           the cost measured at load)  --expert-cache lfu|lru (lfu)
           --expert-prefetch (copy the next MoE layer's guessed experts ahead)
           --expert-cpu-share F|auto (0 < F <= 1: that share of the experts is computed on
           the host's cores when missed, inside the CUDA-graph step; fp8-row; auto: each
           layer-step's misses split by the host's and the bus's costs timed at load, and the
           hand-off left out of the step while it saves less than it costs; default none)
Artifact:  --no-verify (skip the load-time check of the payload against the SHA-256 the
           artifact records in metadata.payload_sha256; a mismatch refuses to start)
Speculation: --spec mtp|dflash|dflash2  --draft-tokens N  --lm-head-draft
           --log-speculation-detail
Vision:    --vision  --no-vision  --vision-device N  --max-vision-tokens N (16384)
           --media-cache-mib N (1024)  --media-live-mib N (2048)  --media-preprocess-threads N
           --media-allow-private (media URLs may reach loopback, private and link-local
           addresses; refused by default)
Prefix reuse: --device-state-slots N  --host-state-slots N  --host-kv-mib N
           --max-private-continuations N  --max-shared-prefixes N
           --max-long-anchors-per-continuation N  --turn-anchors N  --no-prefix-reuse
Requests:  --no-thinking  --preserve-thinking  --default-max-tokens N (8192)
           --default-thinking-budget N  --chat-template FILE  --context-cost-presets FILE
Sampler:   --greedy  --temperature F  --top-p F  --top-k N  --min-p F  --seed N
           --presence-penalty F  --frequency-penalty F
Logs:      --log-level trace|debug|info|warn|error|critical|off  --log-stats-interval-ms N
           --request-log-jsonl FILE  --response-store-max-records N
           --response-store-max-mib N  --no-tui

Environment: NINFER_HOME (default ~/.cache/ninfer), NINFER_CUDA_SYNC
(spin|blocking|yield|auto), NINFER_RAM_GUARD=0, NINFER_HOST_TIER_RAM_GUARD=0.
Exit status: 0 on SIGINT/SIGTERM, 1 on a startup failure, 2 after an engine-wide failure.
"""


def _fail(message: str, usage: bool = False) -> int:
    print(f"ninfer-serve: error: {message}", file=sys.stderr)
    if usage:
        print(USAGE, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parsed = parse_args(argv)
    except UsageError as exc:
        return _fail(str(exc), usage=True)
    if parsed.help:
        print(HELP, end="")
        return 0
    config = parsed.config
    try:
        check_features(config, parsed.explicit, probe_machine())
    except FeatureUnavailable as exc:
        return _fail(str(exc))
    if not config.artifact.is_file():
        defaulted = not argv or argv[0].startswith("-")
        hint = " (run ./install.sh to prepare the default model)" if defaulted else ""
        return _fail(f"artifact not found: {config.artifact}{hint}")
    if not config.no_tui and all(s.isatty() for s in (sys.stdin, sys.stdout, sys.stderr)):
        from .console import run_console  # Textual is imported only for the console

        return run_console(argv, config)
    from .headless import run_headless

    return run_headless(argv, config)


if __name__ == "__main__":
    sys.exit(main())
