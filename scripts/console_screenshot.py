"""Screenshots of the real console under real load, for README's "The console".

Starts `ninfer-serve` in a detached tmux session (a real terminal), loads it with streamed chat
requests from the official `openai` SDK (each client sends its next request as soon as the last
one ends), lets the per-second history fill for `--warm` seconds, then presses the console's `s`
key (save the screen as SVG) once per `--size` (the tmux window is resized between shots) and
copies each SVG to `--out/NAME-WxH.svg`. Last it quits the console with a drain and prints the
facts a caption needs: the load, the machine, the date.

    .venv/bin/python scripts/console_screenshot.py                   # the default model, CPU
    .venv/bin/python scripts/console_screenshot.py --name console_h200 --clients 12 \\
        -- /path/model.ninfer --max-concurrency 8                       # a GPU box

Everything after `--` goes to `ninfer-serve` (the default: the default model with
`--max-concurrency 4`). `--fault N` starts the engine with `NINFER_FAULT=step:N` and shoots
once it has FAILED. Loopback only; needs the `openai` package. Without tmux (e.g. a GPU box
with nothing to install from) `--terminal pty` runs the console on a pseudo-terminal of this
process instead: the same console, keys written to the terminal, its output read and dropped.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import platform
import pty
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

TAIL_BYTES = 65536  # of the console's output kept for a failure's message
SCRIPT = Path(sys.executable).with_name("ninfer-serve")
# without the installed script (a GPU box running the checkout), the module it runs
SERVE = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "ninfer_tui.cli"]
DEFAULT_SERVE_ARGS = ["--max-concurrency", "4"]
SYSTEM = ("You are a concise assistant for a lighthouse museum. Answer in plain sentences, "
          "no lists, and stay on the question.")  # shared by every request: a reusable prefix
QUESTIONS = [
    "Tell me a story about a lighthouse keeper and a storm.",
    "Why do lighthouses flash in patterns?",
    "Describe the lens of an old lighthouse.",
    "What did a lighthouse keeper do every night?",
    "Write a short poem about the sea at dawn.",
    "How were lighthouses powered before electricity?",
    "Explain how ships used lighthouses to navigate.",
    "Describe a day in the life of a harbour pilot.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_for(predicate, timeout: float, what: str, terminal=None) -> None:
    """Poll `predicate` until it holds; stop at once if `terminal`'s console has exited, and
    on either failure print the last of what the console wrote (pty) or showed (tmux)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if terminal is not None and not terminal.alive():
            raise SystemExit(f"console_screenshot: the console exited while waiting for {what}"
                             f"\n{terminal.tail()}")
        time.sleep(0.5)
    tail = f"\n{terminal.tail()}" if terminal is not None else ""
    raise SystemExit(f"console_screenshot: timed out after {timeout:.0f} s waiting for "
                     f"{what}{tail}\n(the console's screen ends above; this is after it)")


def tmux(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=10)


class TmuxTerminal:
    """The command in a detached tmux session."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, size) -> None:
        self.session = f"ninfer-shot-{os.getpid()}"
        assigned = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        line = f"{assigned} exec {shlex.join(command)}" if env else f"exec {shlex.join(command)}"
        subprocess.run(["tmux", "new-session", "-d", "-s", self.session, "-x", str(size[0]),
                        "-y", str(size[1]), "-c", str(cwd), line], check=True, timeout=10)

    def resize(self, size) -> None:
        tmux("resize-window", "-t", self.session, "-x", str(size[0]), "-y", str(size[1]))

    def send(self, key: str) -> None:
        tmux("send-keys", "-t", self.session, key)

    def alive(self) -> bool:
        return tmux("has-session", "-t", self.session).returncode == 0

    def tail(self) -> str:
        return tmux("capture-pane", "-p", "-t", self.session).stdout

    def kill(self) -> None:
        tmux("kill-session", "-t", self.session)


class PtyTerminal:
    """The command on a pseudo-terminal of this process; its output is read and dropped."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, size) -> None:
        full_env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor", **env}
        pid, self.fd = pty.fork()
        if pid == 0:  # the child: size the terminal before the console reads it
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
            os.chdir(cwd)
            os.execve(command[0], command, full_env)
        self.pid = pid
        self.last = b""  # the end of what the console wrote (for a failure's message)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            self.last = (self.last + data)[-TAIL_BYTES:]

    def tail(self) -> str:
        """The console's last output as text, terminal escapes removed."""
        text = re.sub(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][0-9A-B]|.)", "",
                      self.last.decode(errors="replace"))
        return "\n".join(line.rstrip() for line in text.splitlines() if line.strip())[-8000:]

    def resize(self, size) -> None:  # the kernel sends SIGWINCH to the console
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))

    def send(self, key: str) -> None:
        os.write(self.fd, key.encode())

    def alive(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:  # already reaped
            return False

    def kill(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


class Load:
    """`clients` threads, each streaming one chat request after another until stopped."""

    def __init__(self, base_url: str, model: str, clients: int, max_tokens: int) -> None:
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
        self.model, self.max_tokens = model, max_tokens
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done = self.failed = self.tokens = 0
        self.first_error: str | None = None  # a client's first exception, for a failure
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(clients)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def run(self, i: int) -> None:
        n = i
        while not self.stop.is_set():
            question = QUESTIONS[n % len(QUESTIONS)]
            n += len(self.threads)
            try:
                stream = self.client.chat.completions.create(
                    model=self.model, max_tokens=self.max_tokens, stream=True,
                    stream_options={"include_usage": True},
                    messages=[{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": question}])
                tokens = 0
                for chunk in stream:
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                with self.lock:
                    self.done += 1
                    self.tokens += tokens
            except Exception as exc:  # a refused or cut request (the injected fault): go on
                with self.lock:
                    self.failed += 1
                    self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"
                self.stop.wait(1.0)

    def finish(self, timeout: float) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout / len(self.threads))


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus = ""
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split("\n")
        gpus = ", ".join(g.strip() for g in out if g.strip())
    cores = os.cpu_count()
    return f"{cpu}, {cores} cores" + (f", {gpus}" if gpus else ", no GPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("screenshots"))
    parser.add_argument("--name", default="console_cpu")
    parser.add_argument("--size", action="append", default=None,
                        help="WxH, once per shot (default 140x44)")
    parser.add_argument("--clients", type=int, default=6, help="streaming clients (6)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warm", type=float, default=90.0,
                        help="seconds of load before the first shot (90)")
    parser.add_argument("--ready-timeout", type=float, default=600.0,
                        help="seconds to wait for the engine to be ready (600); past it the "
                        "console's last screen is printed (a load error shows there)")
    parser.add_argument("--fault", type=int, default=None,
                        help="NINFER_FAULT=step:N; shoot once the engine has FAILED")
    parser.add_argument("--terminal", choices=("tmux", "pty"),
                        default="tmux" if shutil.which("tmux") else "pty",
                        help="where the console runs (tmux when installed, else pty)")
    parser.add_argument("serve_args", nargs="*", help="after --: ninfer-serve's arguments")
    args = parser.parse_args()
    if args.terminal == "tmux" and shutil.which("tmux") is None:
        raise SystemExit("console_screenshot: tmux is not installed (--terminal pty)")
    sizes = [tuple(int(v) for v in s.split("x")) for s in (args.size or ["140x44"])]
    serve_args = args.serve_args or DEFAULT_SERVE_ARGS
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="ninfer-shot-"))
    env = {"NINFER_FAULT": f"step:{args.fault}"} if args.fault is not None else {}
    command = [*SERVE, *serve_args, "--host", "127.0.0.1", "--port", str(port)]
    terminal_class = TmuxTerminal if args.terminal == "tmux" else PtyTerminal
    terminal = terminal_class(command, env, work, sizes[0])
    load = None
    try:
        try:
            wait_for(lambda: (get_json(url + "/engine/state") or {}).get("state") == "ready",
                     args.ready_timeout, "the engine to be ready", terminal)
        except SystemExit as stop:  # the engine's log is in the console's log panel: show it
            if not terminal.alive():
                raise
            terminal.send("l")
            time.sleep(1.5)
            state = get_json(url + "/engine/state") or {}
            brief = {k: state.get(k) for k in ("state", "failure", "uptime_s")}
            raise SystemExit(f"{stop}\n/engine/state: {brief}\nthe console's log panel:\n"
                             f"{terminal.tail()}") from None
        model = get_json(url + "/v1/models")["data"][0]["id"]
        load = Load(url + "/v1", model, args.clients, args.max_tokens)
        load.start()
        started = time.monotonic()
        time.sleep(args.warm)

        def shot_ready() -> bool:
            state = get_json(url + "/engine/state") or {}
            if args.fault is not None:
                return state.get("state") == "failed"
            return bool(state.get("queue", {}).get("running"))

        what = "the engine to be failed" if args.fault is not None else "requests running"
        try:
            wait_for(shot_ready, 300, what, terminal)
        except SystemExit as stop:  # say why the clients got nowhere, last (it is read first)
            raise SystemExit(f"{stop}\nload: {load.done} requests done, {load.failed} failed;"
                             f" the first failure: {load.first_error}") from None
        time.sleep(1.0)  # the console polls every 250 ms: let it draw what the state said
        loaded_s = time.monotonic() - started
        with load.lock:
            counts = (load.done, load.failed, load.tokens)
        shots = []
        for width, height in sizes:
            terminal.resize((width, height))
            time.sleep(1.5)
            before = set(work.glob("ninfer-console-*.svg"))
            terminal.send("s")
            wait_for(lambda: set(work.glob("ninfer-console-*.svg")) - before, 20, "the SVG",
                     terminal)
            time.sleep(0.5)  # written in one call; let it close
            (svg,) = set(work.glob("ninfer-console-*.svg")) - before
            args.out.mkdir(parents=True, exist_ok=True)
            target = args.out / f"{args.name}-{width}x{height}.svg"
            shutil.copyfile(svg, target)
            shots.append(str(target))
    finally:
        if load is not None:
            load.finish(timeout=30)
        terminal.send("q")
        time.sleep(1.0)
        terminal.send("y")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and terminal.alive():
            time.sleep(0.5)
        terminal.kill()
        shutil.rmtree(work, ignore_errors=True)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print("\n".join(shots))
    print(f"server: ninfer-serve {' '.join(serve_args)} in {args.terminal}"
          + (f" with NINFER_FAULT=step:{args.fault}" if args.fault is not None else ""))
    print(f"load: {args.clients} clients (openai {__import__('openai').__version__}), streamed "
          f"chat requests back to back, max_tokens {args.max_tokens}; shot after "
          f"{loaded_s:.0f} s of load (by then {counts[0]} requests done, {counts[1]} failed, "
          f"{counts[2]} tokens streamed)")
    print(f"machine: {machine()}")
    print(f"date: {date}")


if __name__ == "__main__":
    main()
