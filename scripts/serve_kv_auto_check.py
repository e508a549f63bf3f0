"""`ninfer-serve --kv-capacity auto` for real on one GPU: the pool it logs against nvidia-smi,
then a prompt that fills the whole `--max-context` window and one that overflows it.

    python3 scripts/serve_kv_auto_check.py [--arch 27b] [--layers 4] [--max-context 131072]

Builds a random-weight artifact at real shapes (`ninfer synth`, first N layers), serves it
headless on 127.0.0.1, and prints one JSON report: the startup line, GPU memory used / total
after startup and after the long prompt, the long prompt's usage and time, and the overflow's
HTTP status. Exit 1 when any check fails. Needs a CUDA device and the Qwen tokenizer wheel.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 18931
READY_S = 300


def gpu_memory_mib() -> list[int] | None:
    """[used, total] MiB of GPU 0, None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True)
    except FileNotFoundError:
        return None
    return [int(v) for v in out.stdout.split("\n")[0].split(",")]


def post(path: str, body: dict, timeout: float) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read() or b"{}")


def wait_ready(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ninfer-serve exited with {proc.returncode} during startup")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"not ready after {READY_S} s")


def count_tokens(text: str) -> int:
    status, body = post("/v1/messages/count_tokens", {
        "model": "m", "messages": [{"role": "user", "content": text}]}, 120)
    assert status == 200, body
    return body["input_tokens"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="27b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-context", type=int, default=131072)
    ap.add_argument("--kv-capacity", default="auto", help="a number to smoke-test on the CPU")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvauto-"))
    model = work / f"{args.arch}.ninfer"
    subprocess.run([sys.executable, "-m", "ninfer_engine.cli.tools", "synth", "--arch", args.arch,
                    "--layers", str(args.layers), "-o", str(model), "--seed", "1"], check=True)
    before = gpu_memory_mib()
    log_path = work / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ninfer_tui.cli", str(model), "--no-tui", "--host", "127.0.0.1",
         "--port", str(PORT), "--kv-capacity", args.kv_capacity,
         "--model-id", "m", "--max-context", str(args.max_context),
         "--log-level", "info"], stdout=subprocess.DEVNULL, stderr=log_path.open("wb"),
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    report: dict = {"arch": args.arch, "layers": args.layers, "max_context": args.max_context,
                    "gpu_mib_before": before}
    failures = []
    try:
        wait_ready(proc)
        log_text = log_path.read_text()
        line = re.search(r"--kv-capacity auto: .*", log_text)
        report["startup_line"] = line.group(0) if line else None
        report["gpu_mib_after_start"] = gpu_memory_mib()
        # fill the window up to 256 tokens short of it (room for the template and one reply)
        unit = " hello"
        per = count_tokens(unit * 1000) / 1000
        text = unit * int((args.max_context - 256) / per)
        prompt_tokens = count_tokens(text)
        t0 = time.monotonic()
        status, body = post("/v1/chat/completions", {
            "model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8,
            "temperature": 0}, 600)
        report["long_prompt"] = {"status": status, "seconds": round(time.monotonic() - t0, 2),
                                 "counted_tokens": prompt_tokens, "usage": body.get("usage"),
                                 "error": body.get("error")}
        report["gpu_mib_after_long_prompt"] = gpu_memory_mib()
        if status != 200:
            failures.append("long prompt failed")
        status, body = post("/v1/chat/completions", {
            "model": "m", "messages": [{"role": "user", "content": text + unit * 4096}],
            "max_tokens": 8}, 120)
        report["overflow"] = {"status": status, "error": body.get("error")}
        if status != 400:
            failures.append("overflow not refused with 400")
        if line is None and args.kv_capacity == "auto":
            failures.append("no --kv-capacity auto line in the log")
    finally:
        proc.terminate()
        report["exit_code"] = proc.wait(60)
        report["log_tail"] = log_path.read_text()[-3000:]
    report["failures"] = failures
    print(json.dumps(report, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
