"""The grammar mask's cost per decode step, filled synchronously and hidden behind the forward
(issue 21: < 5 % of a decode step at batch 8 on the H200).

    python3 bench/mask_cost.py --batches 1,8 --forward-ms 2,5 --steps 200 \
        --step-results bench/results/h200-ninfer-bench-35b-a3b-fp8.json \
        bench/results/h200-ninfer-bench-27b.json --out bench/results/h200-mask-overlap.json

Both parts use the tiny Qwen3.5 dense artifact (`artifact.synth`, written to a temporary
directory) for its real Qwen3.5 tokenizer (248K tokens, 248320 logits a row) and a json_schema
constraint on every row (SCHEMA: a nested object with enums, an array and bounded strings).

(a) fill: `mask.bitmasks` of B rows, timed step by step (the first fill of each state: llguidance
caches a state's mask), with model-like logits (`mask_teacher`: peaked at the next token of a
valid document) and random ones (the old worst case: rows stay in free strings). The tokens are
sampled with the engine's sampler (temperature 1, top_k 20: the model preset) from the masked
logits; a row whose grammar ended starts again.

(b) exposed: the engine's own step loop (`Engine.step`) with the runner's forward replaced by a
stand-in that counts each row's tokens as computed, hands out the teacher's logits and returns
`--forward-ms` after it began (sleeping, so the host is free as while a GPU computes; on a GPU
the engine waits for the forward at sampling, the stand-in inside it: the mask work either way
has the forward's time to run in). B constrained requests run at once (one that ends is replaced
by a new one, whose first mask cannot be prefetched). Exposed = the engine thread's time in
`prefetch.start` and `prefetch.bitmasks` (handing rows to the worker, waiting for its fill,
filling rows itself), per step, with prefetching on and off (`prefetch.ENABLED`), beside the
step time without any grammar.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import llguidance
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.mask_teacher import Teacher  # noqa: E402
from bench.report import ForeignLoad, cpu_machine, write_report  # noqa: E402
from ninfer_engine.artifact.synth import write_synthetic  # noqa: E402
from ninfer_engine.config import EngineConfig  # noqa: E402
from ninfer_engine.constrained import compile_constraint, json_schema_grammar  # noqa: E402
from ninfer_engine.constrained import mask, prefetch  # noqa: E402
from ninfer_engine.constrained.matcher import llg_tokenizer  # noqa: E402
from ninfer_engine.engine import Engine  # noqa: E402
from ninfer_engine.step.runner import _work  # noqa: E402
from ninfer_engine.step.sampling import Sampler, sample_rows  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "favourite", "address", "tags"],
          "properties": {
              "name": {"type": "string", "maxLength": 40},
              "age": {"type": "integer", "minimum": 0, "maximum": 150},
              "favourite": {"enum": ["red", "green", "blue"]},
              "address": {"type": "object", "additionalProperties": False,
                          "required": ["city", "country"],
                          "properties": {"city": {"type": "string", "maxLength": 40},
                                         "country": {"type": "string", "maxLength": 40}}},
              "tags": {"type": "array", "maxItems": 3,
                       "items": {"type": "string", "maxLength": 20}}}}
PARAMS = SamplingParams(temperature=1.0, top_k=20)
WARM = 10  # untimed first steps
RUNS = ("plain", "off", "on")


def summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"median_ms": statistics.median(times), "mean_ms": statistics.mean(times),
            "p90_ms": ordered[int(0.9 * (len(ordered) - 1))]}


def fill_part(engine: Engine, batch: int, steps: int, mode: str) -> dict:
    """(a): the synchronous fill of B rows per step."""
    grammar, tokenizer = json_schema_grammar(SCHEMA), engine.tokenizer
    encode, eos = llg_tokenizer(tokenizer).tokenize_str, tokenizer.eos_token_ids[0]
    columns, device = engine.model.vocab_size, engine.model.device
    teacher = Teacher(encode, eos, columns, batch, device, mode)
    rows = [compile_constraint(tokenizer, grammar) for _ in range(batch)]
    outputs: list[list[int]] = [[] for _ in range(batch)]
    keys = list(range(batch))
    samplers = [Sampler(PARAMS) for _ in range(batch)]  # the grammar is applied here, once
    times, restarts, next_key = [], 0, batch
    for step in range(steps + WARM):
        started = time.perf_counter()
        bits = mask.bitmasks(rows, device.type == "cuda")
        if step >= WARM:
            times.append((time.perf_counter() - started) * 1000)
        logits = teacher.logits(keys, outputs)
        masked = mask.apply_constraints(logits, list(range(batch)), rows, bits)
        for i, token in enumerate(sample_rows(masked, samplers)):
            rows[i].advance(token)
            outputs[i].append(token)
            if token == eos or rows[i].matcher.is_stopped():
                rows[i], outputs[i] = compile_constraint(tokenizer, grammar), []
                teacher.forget(keys[i])
                keys[i], next_key, restarts = next_key, next_key + 1, restarts + 1
    return {"batch": batch, "logits": mode, "steps": steps, **summary(times),
            "grammars_finished": restarts, "desynced_rows": len(teacher.desynced)}


class StandIn:
    """The engine's runner with `forward` replaced (see the module docstring)."""

    def __init__(self, inner, teacher: Teacher, seconds: float) -> None:
        self.inner, self.teacher, self.seconds = inner, teacher, seconds
        self.overruns = 0

    def forward(self, batch):
        started = time.perf_counter()
        for seq, ids, _ in _work(batch):
            seq.cached += len(ids)
        logits = self.teacher.logits([seq.id for seq in batch.sampled],
                                     [seq.output for seq in batch.sampled])
        left = started + self.seconds - time.perf_counter()
        if left > 0:
            time.sleep(left)
        else:
            self.overruns += 1
        return logits

    def __getattr__(self, name):
        return getattr(self.inner, name)


def exposed_part(engine: Engine, batch: int, forward_ms: float, steps: int, run: str) -> dict:
    """(b): the engine thread's exposed mask time per step; `run`: "on" / "off" (prefetching),
    or "plain" (no grammar: the step time without any mask work)."""
    tokenizer, grammar = engine.tokenizer, json_schema_grammar(SCHEMA)
    encode, eos = llg_tokenizer(tokenizer).tokenize_str, tokenizer.eos_token_ids[0]
    teacher = Teacher(encode, eos, engine.model.vocab_size, batch, engine.model.device)
    inner = engine.runner
    stand_in = engine.runner = StandIn(inner, teacher, forward_ms / 1000)
    # a lookahead step would launch the real forward behind the stand-in's back (grammar rows
    # never go ahead, so only the plain run would): every run steps the ordinary way
    lookahead, engine._lookahead.enabled = engine._lookahead.enabled, False
    prefetch.ENABLED = run == "on"
    spent = {"fill": 0.0, "apply": 0.0}
    originals = prefetch.bitmasks, mask.apply_constraints, prefetch.start

    def timed(what, call):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[what] += time.perf_counter() - started
        return wrapper

    prefetch.bitmasks = timed("fill", originals[0])
    mask.apply_constraints = timed("apply", originals[1])
    prefetch.start = timed("fill", originals[2])  # handing the rows to the worker counts too
    live: dict[str, list] = {}
    made = [0]

    def top_up():
        while len(live) < batch:
            rid = f"b{batch}-f{forward_ms}-{run}-{made[0]}"
            made[0] += 1
            prompt = tuple(tokenizer.encode(f"<|im_start|>user\nPerson {made[0]} as JSON"
                                            "<|im_end|>\n<|im_start|>assistant\n"))
            live[rid] = []
            constraint = None if run == "plain" else compile_constraint(tokenizer, grammar)
            request = GenerationRequest(rid, prompt, PARAMS, max_tokens=400,
                                        constraint=constraint)
            engine.add(request, live[rid].append)

    exposed, applied, step_ms, running, ended, by_length = [], [], [], [], 0, 0
    prefetch.COUNTERS.reset()
    try:
        with torch.inference_mode():
            for step in range(steps + WARM):
                top_up()
                spent["fill"] = spent["apply"] = 0.0
                started = time.perf_counter()
                engine.step()
                if step >= WARM:
                    step_ms.append((time.perf_counter() - started) * 1000)
                    running.append(len(engine.scheduler.running))
                    exposed.append(spent["fill"] * 1000)
                    # apply_constraints' own time includes nothing of the fill: bits are given
                    applied.append(spent["apply"] * 1000)
                for rid in [r for r, events in live.items() if events and events[-1].finish]:
                    finish = live[rid][-1].finish
                    assert finish in ("stop", "length"), live[rid][-1]
                    by_length += finish == "length"
                    del live[rid]
                    teacher.forget(rid)
                    ended += 1
            for rid in live:  # the rest end as cancelled at the next step
                engine.cancel(rid)
            engine.step()
    finally:
        (prefetch.bitmasks, mask.apply_constraints, prefetch.start), engine.runner = (
            originals, inner)
        engine._lookahead.enabled = lookahead
        prefetch.ENABLED = True
    c = prefetch.COUNTERS
    return {"batch": batch, "forward_ms": forward_ms, "run": run, "steps": steps,
            "exposed": exposed, "apply": applied, "step": step_ms, "running": running,
            "prefetched_rows": c.prefetched_rows, "sync_rows": c.sync_rows,
            "requests_ended": ended, "ended_by_length": by_length,
            "desynced_rows": len(teacher.desynced), "forward_overruns": stand_in.overruns}


def merged(parts: list[dict], loads: list[float | None]) -> dict:
    """One (B, forward, run) row from its rounds: samples pooled, counts summed."""
    out = {k: parts[0][k] for k in ("batch", "forward_ms", "run")}
    for key in ("exposed", "apply", "step"):
        out[key] = summary([t for p in parts for t in p[key]])
    out["mean_rows"] = statistics.mean(n for p in parts for n in p["running"])
    for key in ("steps", "prefetched_rows", "sync_rows", "requests_ended", "ended_by_length",
                "desynced_rows", "forward_overruns"):
        out[key] = sum(p[key] for p in parts)
    known = [x for x in loads if x is not None]
    out["foreign_load_cores"] = statistics.mean(known) if known else None
    return out


def markdown(r: dict) -> str:
    lines = [f"# Grammar mask cost per decode step, filled and overlapped ({r['device']})", "",
             f"- machine: {r['machine']}", f"- command: `{r['command']}`, {r['date']}",
             f"- vocabulary: {r['vocab']} tokens, {r['columns']} logits a row; json_schema "
             "constraint on every row (bench/mask_cost.py SCHEMA)", "",
             "## (a) Synchronous fill of B rows per step (`mask.bitmasks`)", "",
             "| B | logits | median ms | mean ms | p90 ms | grammars ended |"
             + "".join(f" mean as % of {s} step |" for s in r["recorded"]),
             "|---|---|---|---|---|---|" + "---|" * len(r["recorded"])]
    for row in r["fill"]:
        shares = [f"{100 * row['mean_ms'] / s[row['batch']]:.1f} % of {s[row['batch']]:.2f} ms"
                  if row["batch"] in s else "—" for s in r["recorded"].values()]
        lines.append(f"| {row['batch']} | {row['logits']} | {row['median_ms']:.3f} | "
                     f"{row['mean_ms']:.3f} | {row['p90_ms']:.3f} | {row['grammars_finished']} |"
                     + "".join(f" {share} |" for share in shares))
    lines += ["", "## (b) Mask time exposed in the engine step, stand-in forward", "",
              "| B | forward ms | grammar | fill exposed median ms | fill exposed mean ms | "
              "apply mean ms | step median ms | step mean ms | step mean over plain | "
              "over plain / plain step | "
              "fill exposed mean / step mean | mean rows | prefetched rows | sync rows | "
              "forward overruns | other load, cores |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    plain = {(row["batch"], row["forward_ms"]): row["step"]["mean_ms"]
             for row in r["exposed"] if row["run"] == "plain"}
    for row in r["exposed"]:
        e, a, s = row["exposed"], row["apply"], row["step"]
        what = {"plain": "none", "off": "prefetch off", "on": "prefetch on"}[row["run"]]
        base = plain.get((row["batch"], row["forward_ms"]), s["mean_ms"])
        over = s["mean_ms"] - base
        lines.append(f"| {row['batch']} | {row['forward_ms']:g} | {what} | {e['median_ms']:.3f} | "
                     f"{e['mean_ms']:.3f} | {a['mean_ms']:.3f} | {s['median_ms']:.3f} | "
                     f"{s['mean_ms']:.3f} | {over:+.3f} ms | {100 * over / base:+.1f} % | "
                     f"{100 * e['mean_ms'] / s['mean_ms']:.1f} % | {row['mean_rows']:.2f} | "
                     f"{row['prefetched_rows']} | {row['sync_rows']} | "
                     f"{row['forward_overruns']} | {load(row['foreign_load_cores'])} |")
    lines += ["", "(a): the first fill of each state, per step; the % columns compare the mean "
              "with the step time `ninfer bench` recorded (files named there), not measured in "
              "this run. (b): fill exposed = the engine thread's time in `prefetch.start` and "
              "`prefetch.bitmasks` per step (handing rows to the worker, waiting for its fill, "
              "filling rows itself); over plain: the whole cost of the grammar in the step "
              "(fill exposed, apply, the matchers' consume of each token, the constrained "
              "rows' sampling path) against the step without one; apply = its time in "
              "`mask.apply_constraints` (the bits' copy and the masking: torch ops on the CPU, "
              "one kernel on a GPU, whose launch alone is timed); the step includes the "
              "stand-in forward, and `engine.step`'s own work (scheduling, sampling 248K "
              "columns, events)."]
    return "\n".join(lines) + "\n"


def load(cores: float | None) -> str:
    return "?" if cores is None else f"{cores:.2f}"


def recorded_steps(paths: list[Path]) -> dict[str, dict[int, float]]:
    """{shape: {B: step ms}} from `ninfer bench` results (the concurrency rows)."""
    import json

    return {p.stem: {row["concurrency"]: row["step_ms"]
                     for row in json.loads(p.read_text())["concurrency"]} for p in paths}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--forward-ms", default="2,5")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4, help="(b): runs interleaved so")
    parser.add_argument("--step-results", type=Path, nargs="*", default=[])
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic("tiny-dense", Path(tmp) / "tiny.ninfer")
        # pages for every row's whole request at once, so B rows run together
        engine = Engine(EngineConfig(artifact=path, max_context=1024,
                                     kv_capacity=1024 * max(batches),
                                     max_concurrency=max(batches)))
        fill = [fill_part(engine, b, args.steps, mode) for b in batches
                for mode in ("teacher", "random")]
        exposed = []
        for b in batches:
            for ms in args.forward_ms.split(","):
                # rounds of the three runs in turn, so drift in the machine's load hits all
                parts: dict[str, tuple[list, list]] = {r: ([], []) for r in RUNS}
                for _ in range(args.rounds):
                    for run in RUNS:
                        with ForeignLoad() as load:
                            parts[run][0].append(exposed_part(
                                engine, b, float(ms), args.steps // args.rounds, run))
                        parts[run][1].append(load.cores)
                exposed += [merged(*parts[run]) for run in RUNS]
        engine.stop()
    cuda = engine.model.device.type == "cuda"
    device = torch.cuda.get_device_name() if cuda else "CPU"
    machine = cpu_machine(llguidance=llguidance.__version__ if hasattr(
        llguidance, "__version__") else "?", device=device)
    result = {"device": device, "machine": ", ".join(f"{k} {v}" for k, v in machine.items()),
              "command": " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "vocab": llg_tokenizer(engine.tokenizer).vocab_size,
              "columns": engine.model.vocab_size, "fill": fill, "exposed": exposed,
              "recorded": recorded_steps(args.step_results)}
    write_report(args.out, result, markdown)


if __name__ == "__main__":
    main()
