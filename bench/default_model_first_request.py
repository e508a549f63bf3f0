"""The README's first request, 50 times, on the default model: how long, how long an answer,
and whether it names Paris, under the new defaults and under the earlier ones.

    .venv/bin/python bench/default_model_first_request.py [--runs 50] [--only new|earlier|guard]

Starts a real `ninfer-serve --no-tui` on a free loopback port and sends the README's curl body
(`What is the capital of France?`, model `smollm2-135m-instruct`) with `"seed": i` for
i = 0..runs-1, one request at a time, over HTTP like curl. Per answer: wall time (request sent to
the body read), completion tokens, finish reason, whether the text contains "paris"
(case-insensitive), the server's own TTFT and decode rate (its `req#… done` log line), and the
CPU that other processes used meanwhile (in cores; the machine is shared, and one busy core
elsewhere slows the server's 2-thread decode several times). Before each request the script
waits until other processes use less than `--quiet` cores (0.3) over a second, and an answer
during which they used more than `--busy` cores (0.5) is sent again (the same seed gives the same
answer; at most `--retries` times); every set-aside attempt is kept in the results. Three runs:

* `new-readme`: the installed default model (install.sh's artifact, its generation_config.json
  recorded in the results) and the README's curl as the README now gives it (with `max_tokens`);
* `new-defaults`: the same server, the curl body without `max_tokens`, so the artifact's own
  output cap and sampler preset decide;
* `earlier`: an artifact converted from the same GGUF with the earlier preset (temperature 0.2,
  top-p 0.9, nothing else: the server's limit was then 8192 tokens), each request bounded with
  `max_tokens` 150 so that the run ends (a drifting answer would otherwise run to 8,155 tokens);
  an answer cut there counts as `length`.

Writes bench/results/cpu-default-first-request.{json,md}. `--only guard` instead sweeps the
repetition guards the sampler has (`GUARDS`: none, frequency or presence penalty) as request
fields over the earlier preset, each capped at the README's `max_tokens`, and writes
bench/results/cpu-default-first-request-guard.{json,md}: how the guard was chosen.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import cpu_machine, write_report  # noqa: E402
from ninfer_engine.cli.flags import default_artifact, ninfer_home  # noqa: E402

OUT = ROOT / "bench" / "results" / "cpu-default-first-request"
QUESTION = "What is the capital of France?"
README_BODY = {"model": "smollm2-135m-instruct",
               "messages": [{"role": "user", "content": QUESTION}]}
README_MAX_TOKENS = 96  # the README's curl
EARLIER_PRESET = {"temperature": 0.2, "top_p": 0.9}  # install.sh's `sampling=` before the cap
EARLIER_BOUND = 150  # max_tokens on the earlier defaults' requests, so the run ends
TIME_LIMIT_S = 10.0
# `--only guard`: the candidate repetition guards the sampler has (OpenAI's additive penalties
# on generated tokens), as request fields over the earlier preset, capped at README_MAX_TOKENS
GUARDS = {"no guard": {}, "frequency 0.3": {"frequency_penalty": 0.3},
          "frequency 0.5": {"frequency_penalty": 0.5}, "frequency 1.0": {"frequency_penalty": 1.0},
          "presence 0.5": {"presence_penalty": 0.5}, "presence 1.0": {"presence_penalty": 1.0}}
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # where install.sh downloads it, under NINFER_HOME


class Cpu:
    """CPU time of the whole machine, the server process and this one, to tell foreign load."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.tick = os.sysconf("SC_CLK_TCK")

    def sample(self) -> tuple[float, float, float, float]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / self.tick
        stat = Path(f"/proc/{self.server_pid}/stat").read_text().rsplit(")", 1)[1].split()
        server = (int(stat[11]) + int(stat[12])) / self.tick  # utime + stime, all threads
        ours = os.times()
        return busy, server, ours.user + ours.system, time.monotonic()

    @staticmethod
    def foreign(start, end) -> float:
        busy, server, ours, wall = (e - s for e, s in zip(end, start))
        return max(0.0, (busy - server - ours) / wall) if wall > 0 else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`ninfer-serve ARTIFACT --no-tui` on a free loopback port, for a `with` block."""

    def __init__(self, artifact: Path, log: Path) -> None:
        self.artifact, self.log, self.port = artifact, log, free_port()
        self.served = 0  # requests answered, to find each one's log line
        self.args = [str(ROOT / ".venv" / "bin" / "ninfer-serve"), str(artifact), "--no-tui",
                     "--host", "127.0.0.1", "--port", str(self.port)]

    def __enter__(self) -> Server:
        self.log_file = open(self.log, "w")
        self.process = subprocess.Popen(self.args, stdout=self.log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ninfer-serve exited {self.process.returncode}: see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"ninfer-serve not ready after 300 s: see {self.log}")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log_file.close()

    def last_done(self, count: int) -> dict:
        """TTFT and decode rate of the server's `count`-th `req#… done` log line (waits)."""
        deadline = time.monotonic() + 5
        while True:
            lines = [line for line in self.log.read_text().splitlines() if " done | " in line]
            if len(lines) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if len(lines) < count:
            return {}
        line = lines[count - 1]
        ttft = re.search(r"TTFT ([\d.]+) (ms|s)\b", line)
        decode = re.search(r"decode ([\d.]+) tok/s", line)
        return {"ttft_s": round(float(ttft[1]) / (1000 if ttft[2] == "ms" else 1), 3) if ttft
                else None, "decode_tok_s": float(decode[1]) if decode else None}

    def chat(self, body: dict) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.load(response)


def wait_quiet(cpu: Cpu, cores: float, limit_s: float = 600.0) -> float:
    """Wait until other processes used less than `cores` CPU over one second; the seconds
    waited (the request is sent anyway after `limit_s`)."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        start = cpu.sample()
        time.sleep(1.0)
        if Cpu.foreign(start, cpu.sample()) < cores:
            break
    return round(time.monotonic() - began, 1)


def run_requests(server: Server, extra: dict, runs: int, label: str,
                 quiet_cores: float | None, busy_cores: float, retries: int) -> list[dict]:
    """One answer per seed. An attempt during which other processes used more than
    `busy_cores` is sent again (the same seed gives the same answer), at most `retries` times;
    the set-aside attempts stay in the row's `set_aside`."""
    cpu = Cpu(server.process.pid)
    server.chat({**README_BODY, "max_tokens": 1, "seed": 0})  # warm-up, not counted
    server.served += 1
    rows = []
    for seed in range(runs):
        body = {**README_BODY, **extra, "seed": seed}
        set_aside: list[dict] = []
        while True:
            waited = wait_quiet(cpu, quiet_cores) if quiet_cores is not None else 0.0
            start = cpu.sample()
            began = time.perf_counter()
            reply = server.chat(body)
            wall = time.perf_counter() - began
            end = cpu.sample()
            server.served += 1
            text = reply["choices"][0]["message"]["content"] or ""
            row = {"seed": seed, "wall_s": round(wall, 3),
                   "completion_tokens": reply["usage"]["completion_tokens"],
                   "finish_reason": reply["choices"][0]["finish_reason"],
                   "names_paris": "paris" in text.lower(),
                   "foreign_cores": round(Cpu.foreign(start, end), 2), "waited_quiet_s": waited,
                   **server.last_done(server.served), "text": text}
            print(f"{label} seed {seed:2d}: {wall:5.1f} s {row['completion_tokens']:3d} tok "
                  f"{row['finish_reason']:6s} paris={row['names_paris']!s:5s} "
                  f"foreign {row['foreign_cores']:.2f} | {text[:70]!r}", file=sys.stderr,
                  flush=True)
            if row["foreign_cores"] <= busy_cores or len(set_aside) >= retries:
                break
            set_aside.append({k: row[k] for k in ("wall_s", "foreign_cores", "decode_tok_s",
                                                    "completion_tokens", "text")
                              if k in row})
        rows.append({**row, "set_aside": set_aside})
    return rows


def summary(rows: list[dict]) -> dict:
    walls = [r["wall_s"] for r in rows]
    tokens = [r["completion_tokens"] for r in rows]
    finishes: dict[str, int] = {}
    for r in rows:
        finishes[r["finish_reason"]] = finishes.get(r["finish_reason"], 0) + 1
    return {
        "answers": len(rows), "name_paris": sum(r["names_paris"] for r in rows),
        "finish": finishes, "under_10_s": sum(w < TIME_LIMIT_S for w in walls),
        "wall_s_max": max(walls), "wall_s_median": statistics.median(walls),
        "wall_s_total": round(sum(walls), 1),
        "tokens_max": max(tokens), "tokens_mean": round(statistics.mean(tokens), 1),
        "tok_s_overall": round(sum(tokens) / sum(walls), 1),
        "decode_tok_s_median": round(statistics.median(
            r["decode_tok_s"] for r in rows if r.get("decode_tok_s") is not None), 1),
        "ttft_s_max": max(r["ttft_s"] for r in rows if r.get("ttft_s") is not None),
        "foreign_cores_max": max(r["foreign_cores"] for r in rows),
        "foreign_cores_mean": round(statistics.mean(r["foreign_cores"] for r in rows), 2),
        "waited_quiet_s_total": round(sum(r["waited_quiet_s"] for r in rows), 1),
        "sent_again": sum(bool(r["set_aside"]) for r in rows),
        "set_aside_wall_s_max": max((a["wall_s"] for r in rows for a in r["set_aside"]),
                                    default=None),
    }


def generation_config(artifact: Path) -> dict:
    from ninfer_engine.artifact import open_artifact

    with open_artifact(artifact) as a:
        return json.loads(a.resource("generation_config.json"))


def earlier_artifact(directory: Path) -> Path:
    from ninfer_engine.artifact.convert_gguf import convert_gguf

    gguf = ninfer_home() / "downloads" / GGUF
    if not gguf.exists():
        raise SystemExit(f"{gguf} is missing: run ./install.sh first")
    return convert_gguf(gguf, directory / "earlier.ninfer", name="smollm2-135m-instruct",
                        sampling=EARLIER_PRESET)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--only", choices=("new", "earlier", "guard"),
                        help="run one side only; `guard` is the repetition-guard sweep instead")
    parser.add_argument("--out", type=Path,
                        help=f"result files (default {OUT.relative_to(ROOT)}, "
                             "with --only guard ...-guard)")
    parser.add_argument("--quiet", type=float, default=0.3, metavar="CORES",
                        help="before each request wait (up to 10 min) until other processes "
                             "use less than CORES CPU over a second (default 0.3; -1: never "
                             "wait): the box is shared, and its other users' load is not ours")
    parser.add_argument("--busy", type=float, default=0.5, metavar="CORES",
                        help="send an answer again when other processes used more than CORES "
                             "CPU while it ran (default 0.5); every attempt is kept")
    parser.add_argument("--retries", type=int, default=3,
                        help="how often one answer may be sent again (default 3)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the server on the way out
    args.quiet = None if args.quiet < 0 else args.quiet
    args.out = args.out or (OUT.with_name(OUT.name + "-guard") if args.only == "guard" else OUT)
    command = "python bench/default_model_first_request.py " + " ".join(sys.argv[1:])
    load_before = os.getloadavg()[0]
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="first-request-") as tmp:
        tmp = Path(tmp)
        if args.only in (None, "new"):
            artifact = default_artifact()
            config = generation_config(artifact)
            if "max_new_tokens" not in config:
                raise SystemExit(f"{artifact} has no max_new_tokens: run ./install.sh")
            with Server(artifact, tmp / "new.log") as server:
                for label, extra in (("new-readme", {"max_tokens": README_MAX_TOKENS}),
                                     ("new-defaults", {})):
                    rows = run_requests(server, extra, args.runs, label, args.quiet, args.busy,
                                        args.retries)
                    runs[label] = {"artifact": str(artifact), "generation_config": config,
                                   "request_extra": extra, "summary": summary(rows),
                                   "answers": rows}
        if args.only == "guard":
            artifact = earlier_artifact(tmp)
            with Server(artifact, tmp / "guard.log") as server:
                for label, extra in GUARDS.items():
                    extra = {"max_tokens": README_MAX_TOKENS, **extra}
                    rows = run_requests(server, extra, args.runs, label, args.quiet, args.busy,
                                        args.retries)
                    runs[label] = {"artifact": f"converted from {GGUF} with {EARLIER_PRESET}",
                                   "generation_config": generation_config(artifact),
                                   "request_extra": extra, "summary": summary(rows),
                                   "answers": rows}
        if args.only in (None, "earlier"):
            started = time.monotonic()
            artifact = earlier_artifact(tmp)
            print(f"earlier artifact converted in {time.monotonic() - started:.0f} s",
                  file=sys.stderr)
            with Server(artifact, tmp / "earlier.log") as server:
                extra = {"max_tokens": EARLIER_BOUND}
                rows = run_requests(server, extra, args.runs, "earlier", args.quiet, args.busy,
                                    args.retries)
                runs["earlier"] = {"artifact": f"converted from {GGUF} with "
                                               f"{EARLIER_PRESET} (no max_new_tokens)",
                                   "generation_config": generation_config(artifact),
                                   "request_extra": extra, "summary": summary(rows),
                                   "answers": rows}
    result = {
        "what": "the README's first request on the default model, seeds 0..runs-1, sequential",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": cpu_machine(load_average_before=round(load_before, 2),
                               load_average_after=round(os.getloadavg()[0], 2)),
        "question": QUESTION, "time_limit_s": TIME_LIMIT_S, "quiet_cores": args.quiet,
        "busy_cores": args.busy, "retries": args.retries,
        "runs": runs,
    }
    write_report(args.out, result, markdown)
    return 0


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [
        f"# Default model: the README's first request, "
        f"{len(next(iter(r['runs'].values()))['answers'])} seeds"
        f"{', repetition guards' if 'no guard' in r['runs'] else ''} ({r['date'][:10]})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, 1-minute load average "
        f"{m['load_average_before']} before and {m['load_average_after']} after (shared "
        f"machine). Command: `{r['command'].strip()}`. Date: {r['date']}.",
        "",
        f"Each run starts `ninfer-serve --no-tui` on a free loopback port and sends the README's "
        f"curl body (\"{r['question']}\") with `\"seed\": i`, one request at a time; wall time "
        f"is per HTTP request. \"Foreign\" is the CPU other processes used meanwhile, in cores."
        + ("" if r["quiet_cores"] is None else
           f" Before each request the script waits until other processes used less than "
           f"{r['quiet_cores']} cores over a second (the box is shared; their load is not ours)."),
        "",
        "| run | request | generation_config | name Paris | finish | under 10 s | max s | "
        "median s | max tokens | mean tokens | decode tok/s (median) | max TTFT s | "
        "foreign cores mean / max |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, run in r["runs"].items():
        s = run["summary"]
        config = {k: v for k, v in run["generation_config"].items()
                  if k not in ("bos_token_id", "eos_token_id", "pad_token_id")}
        extra = ", ".join(f"{k} {v}" for k, v in run["request_extra"].items()) or "no max_tokens"
        finish = ", ".join(f"{k} {v}" for k, v in sorted(s["finish"].items()))
        lines.append(
            f"| {label} | {extra} | `{json.dumps(config)}` | {s['name_paris']}/{s['answers']} | "
            f"{finish} | {s['under_10_s']}/{s['answers']} | {s['wall_s_max']:.1f} | "
            f"{s['wall_s_median']:.1f} | {s['tokens_max']} | {s['tokens_mean']} | "
            f"{s['decode_tok_s_median']} | {s['ttft_s_max']:.2f} | "
            f"{s['foreign_cores_mean']} / {s['foreign_cores_max']} |")
    if r["retries"]:
        lines += ["", f"An answer during which other processes used more than "
                  f"{r['busy_cores']} cores was sent again (same seed, same answer; at most "
                  f"{r['retries']} times); the table counts the last attempt, and every "
                  "set-aside attempt is below and in the JSON."]
        for label, run in r["runs"].items():
            aside = [(a["seed"], x) for a in run["answers"] for x in a["set_aside"]]
            lines.append(f"- {label}: " + ("; ".join(
                f"seed {seed} {x['wall_s']:.1f} s ({x['completion_tokens']} tokens, foreign "
                f"{x['foreign_cores']} cores)" for seed, x in aside) or "none"))
    else:
        lines += ["", "No waiting for a quiet machine and no answer sent again: this run is "
                  "about the answers (the same seed gives the same answer), not their times."]
    if "new-defaults" in r["runs"] and "earlier" in r["runs"]:
        new, old = r["runs"]["new-defaults"]["summary"], r["runs"]["earlier"]["summary"]
        slowest = max(run["summary"]["wall_s_max"] for label, run in r["runs"].items()
                      if label.startswith("new"))
        lines += ["", f"Reading: under the new defaults {new['name_paris']} of {new['answers']} "
                  f"answers name Paris (earlier defaults: {old['name_paris']}), "
                  f"{new['finish'].get('stop', 0)} end on their own (earlier: "
                  f"{old['finish'].get('stop', 0)}; {old['finish'].get('length', 0)} still "
                  f"going at 150 tokens), the longest has {new['tokens_max']} tokens and the "
                  f"slowest takes {slowest:.1f} s (earlier: {old['wall_s_max']:.1f} s at the "
                  "150-token bound)."]
    if "no guard" in r["runs"]:
        ranked = sorted(r["runs"].items(), key=lambda kv: (
            kv[1]["summary"]["finish"].get("length", 0), -kv[1]["summary"]["name_paris"]))
        lines += ["", "Reading, fewest answers cut at the cap first, then most naming Paris: "
                  + "; ".join(f"{label} {run['summary']['name_paris']}/"
                              f"{run['summary']['answers']} Paris, "
                              f"{run['summary']['finish'].get('length', 0)} cut"
                              for label, run in ranked) + "."]
    if "earlier" in r["runs"]:
        lines += ["", "`earlier` bounds each request at 150 tokens so the run ends; without that "
                  "bound an answer cut there (`length`) would have run on towards the 8,155 "
                  "tokens left in the context."]
    lines.append("")
    for label, run in r["runs"].items():
        texts: dict[str, int] = {}
        for a in run["answers"]:
            key = a["text"][:80].replace("\n", " ").replace("|", "/")
            texts[key] = texts.get(key, 0) + 1
        common = sorted(texts.items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"{label}, most frequent answer starts: " + "; ".join(
            f"{n}× \"{t}\"" for t, n in common))
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
