"""`NinferConsole`: the Textual operator console of `ninfer-serve`.

The console polls the supervisor's latest `EngineStats` every 250 ms into one reactive `stats`
that every panel is bound to, keeps a short history for the sparklines, and turns keys into
supervisor calls (profile switch, reload, admission pause). `cli.py` builds it; run it with
`NinferConsole(supervisor, title_info=...).run()`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.reactive import reactive
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from ninfer_engine.stats import EngineStats
from ninfer_engine.types import EngineState

from .widgets.banner import FailureBanner
from .widgets.base import NO_STATS, PanelColumn
from .widgets.experts import ExpertPanel
from .widgets.header import HeaderPanel, ServerInfo
from .widgets.history import StatsHistory
from .widgets.kv import KvPanel
from .widgets.log import LogPanel
from .widgets.memory import MemoryPanel
from .widgets.modals import ConfirmScreen, HelpScreen, NoticeScreen
from .widgets.profiles import ProfilePicker
from .widgets.requests import RequestsPanel
from .widgets.slots import StateSlotPanel
from .widgets.spec import SpecPanel

POLL_INTERVAL_S = 0.25
RELOAD_GROUP = "reload"


class ConsoleSupervisor(Protocol):
    """What the console needs of the engine supervisor; everything else stays behind it."""

    @property
    def listen_url(self) -> str: ...
    @property
    def auth_enabled(self) -> bool: ...
    @property
    def artifact(self) -> str: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def profiles(self) -> Mapping[str, Sequence[str]]:
        """Profile name -> the flags it inserts (the `--profile` table)."""

    @property
    def paused(self) -> bool:
        """True while admission of new requests is paused."""

    def snapshot(self) -> EngineStats:
        """The latest published snapshot; cheap, called from the UI thread."""

    def check_profile(self, name: str) -> str | None:
        """None when profile `name` can run on this machine, else the reason it cannot."""

    def reload(self, profile: str | None = None) -> None:
        """Reload the engine (with `profile`, or the current flags); blocks until it is done."""

    def pause_admission(self) -> None: ...
    def resume_admission(self) -> None: ...

    def log_lines(self) -> list[str]:
        """The most recent stderr log lines, oldest first."""


class NinferConsole(App[None]):
    """Live engine panels plus the operator keys listed in the footer."""

    CSS_PATH = "app.tcss"
    TITLE = "ninfer"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding(
            "p",
            "pick_profile",
            "Profile",
            key_display="p",
            tooltip="switch to another profile (the engine reloads with its flags)",
        ),
        Binding(
            "r",
            "reload",
            "Reload",
            key_display="r",
            tooltip="reload the engine: at once after a failure, otherwise after a confirmation",
        ),
        Binding(
            "a",
            "toggle_admission",
            "Pause/resume",
            key_display="a",
            tooltip="pause or resume admitting new requests (running ones finish)",
        ),
        Binding("l", "toggle_log", "Log", key_display="l", tooltip="show or hide the log tail"),
        Binding("question_mark", "help", "Help", key_display="?", tooltip="this list of keys"),
        Binding(
            "q",
            "request_quit",
            "Quit",
            key_display="q",
            tooltip="stop the server; asks first while requests are running or queued",
        ),
    ]

    stats: reactive[EngineStats] = reactive(NO_STATS)
    history: reactive[StatsHistory] = reactive(StatsHistory())
    paused: reactive[bool] = reactive(False)
    show_log: reactive[bool] = reactive(False)
    log_tail: reactive[tuple[str, ...]] = reactive(())

    def __init__(self, supervisor: ConsoleSupervisor, *, title_info: str) -> None:
        """`title_info` is one line shown at the header's right, e.g. version and device names."""
        super().__init__()
        self.supervisor = supervisor
        self.info = ServerInfo(
            title_info=title_info,
            artifact=supervisor.artifact,
            listen_url=supervisor.listen_url,
            auth_enabled=supervisor.auth_enabled,
        )

    def compose(self) -> ComposeResult:
        yield HeaderPanel(self.info).data_bind(NinferConsole.stats, NinferConsole.paused)
        yield FailureBanner().data_bind(NinferConsole.stats)
        with Grid(id="panels"):
            with PanelColumn(id="memory-column"):
                yield MemoryPanel().data_bind(NinferConsole.stats)
                yield StateSlotPanel().data_bind(NinferConsole.stats)
            yield KvPanel().data_bind(NinferConsole.stats)
            yield ExpertPanel().data_bind(NinferConsole.stats)
            yield SpecPanel().data_bind(NinferConsole.stats, NinferConsole.history)
        yield RequestsPanel().data_bind(NinferConsole.stats, NinferConsole.history)
        yield LogPanel().data_bind(lines=NinferConsole.log_tail)
        yield Footer()

    def on_mount(self) -> None:
        self.poll_supervisor()
        self.set_interval(POLL_INTERVAL_S, self.poll_supervisor)

    def poll_supervisor(self) -> None:
        """Take the supervisor's latest snapshot; the bound panels follow."""
        stats = self.supervisor.snapshot()
        self.history = self.history.push(stats)
        self.stats = stats
        self.paused = self.supervisor.paused
        if self.show_log:
            self.log_tail = tuple(self.supervisor.log_lines())

    def watch_show_log(self, show: bool) -> None:
        if show:
            self.log_tail = tuple(self.supervisor.log_lines())
        self.query_one(LogPanel).display = show

    # Keys

    def action_pick_profile(self) -> None:
        picker = ProfilePicker(self.supervisor.profiles, self.supervisor.profile)
        self.push_screen(picker, self.profile_chosen)

    def profile_chosen(self, name: str | None) -> None:
        if name is None:
            return
        reason = self.supervisor.check_profile(name)
        if reason is not None:
            self.push_screen(NoticeScreen(f"Profile {name} cannot run here", reason))
            return
        flags = " ".join(self.supervisor.profiles[name])
        question = f"Reload the engine with profile {name}?"
        detail = f"{flags}\nRunning requests are cut off; the server answers 503 until it is ready."
        self.push_screen(ConfirmScreen(question, detail), lambda yes: self.start_reload(name, yes))

    def action_reload(self) -> None:
        if self.stats.state == EngineState.FAILED.value:
            self.start_reload(None)
            return
        detail = "Running requests are cut off; the server answers 503 until it is ready."
        self.push_screen(
            ConfirmScreen("Reload the engine?", detail), lambda yes: self.start_reload(None, yes)
        )

    def start_reload(self, profile: str | None, confirmed: bool | None = True) -> None:
        if not confirmed:
            return
        if any(w.group == RELOAD_GROUP and w.is_running for w in self.workers):
            self.notify("A reload is already running.", severity="warning")
            return
        self.run_reload(profile)

    @work(thread=True, exit_on_error=False, group=RELOAD_GROUP)
    def run_reload(self, profile: str | None) -> None:
        self.supervisor.reload(profile)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != RELOAD_GROUP:
            return
        if event.state == WorkerState.ERROR:
            self.notify(f"Reload failed: {event.worker.error}", severity="error", timeout=10)
        elif event.state == WorkerState.SUCCESS:
            self.notify("Engine reloaded.")

    def action_toggle_admission(self) -> None:
        if self.supervisor.paused:
            self.supervisor.resume_admission()
        else:
            self.supervisor.pause_admission()
        self.paused = self.supervisor.paused

    def action_toggle_log(self) -> None:
        self.show_log = not self.show_log

    def action_help(self) -> None:
        keys = [(b.key_display or b.key, b.description, b.tooltip) for b in self.BINDINGS]
        self.push_screen(HelpScreen(keys))

    def action_request_quit(self) -> None:
        in_flight = len(self.stats.queue.running) + len(self.stats.queue.pending)
        if not in_flight:
            self.exit()
            return
        question = f"{in_flight} requests are running or queued. Quit anyway?"
        self.push_screen(ConfirmScreen(question), lambda yes: self.exit() if yes else None)
