"""`NinferConsole`: the Textual operator console of `ninfer-serve`.

The console polls the supervisor's latest `EngineStats` every 250 ms into one reactive `stats`
that every panel is bound to, keeps minutes of per-second history for the sparklines (across
reloads), and turns keys into supervisor calls (profile switch, reload, admission pause, cancel,
a draining quit). Under 120×40 cells the engine panels shrink to one line each. `cli.py` builds
it; run it with `NinferConsole(supervisor, title_info=...).run()`.
"""

from __future__ import annotations

import os
import time

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.reactive import reactive
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from ninfer_engine.stats import EngineStats
from ninfer_engine.types import EngineState

from .gpu import GpuMonitor, GpuReading
from .protocol import ConsoleSupervisor
from .widgets.banner import FailureBanner
from .widgets.base import NO_STATS, Panel, PanelColumn
from .widgets.detail import RequestDetail
from .widgets.experts import ExpertPanel
from .widgets.header import HeaderPanel, ServerInfo
from .widgets.history import StatsHistory
from .widgets.kv import KvPanel
from .widgets.latency import LatencyPanel
from .widgets.log import LogPanel
from .widgets.memory import MemoryPanel
from .widgets.modals import ConfirmScreen, HelpScreen, NoticeScreen
from .widgets.profiles import ProfilePicker
from .widgets.requests import RequestsPanel, selectable
from .widgets.slots import StateSlotPanel
from .widgets.spec import SpecPanel
from .widgets.vision import VisionPanel
from .widgets.trends import TrendsPanel

__all__ = ["ConsoleSupervisor", "NinferConsole"]

POLL_INTERVAL_S = 0.25
RELOAD_GROUP = "reload"
COMPACT_BELOW = (120, 40)  # columns, rows
SCROLL_STEP = 30  # seconds of history per [ or ]


def _key(key: str, action: str, name: str, tooltip: str, show: bool = True,
         display: str | None = None) -> Binding:
    return Binding(key, action, name, key_display=display or key, tooltip=tooltip, show=show)


class NinferConsole(App[None]):
    """Live engine panels plus the operator keys listed in the footer."""

    CSS_PATH = "app.tcss"
    TITLE = "ninfer"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        _key("p", "pick_profile", "Profile", "switch profile: the engine reloads with its flags"),
        _key("r", "reload", "Reload", "reload the engine (asks first unless it failed)"),
        _key("a", "toggle_admission", "Pause",
             "pause or resume admission (waiting ones stay listed)"),
        _key("up", "select(-1)", "Select", "move the request cursor", show=False, display="↑/↓"),
        _key("down", "select(1)", "Select", "move the request cursor", show=False),
        _key("enter", "detail", "Detail", "the selected request in full; c cancels it there"),
        _key("c", "cancel_selected", "Cancel", "cancel the selected request (503 to its client)"),
        _key("[", "scroll_history(1)", "History", "scroll the per-second history back / forward",
             show=False, display="[/]"),
        _key("]", "scroll_history(-1)", "Newer", "scroll the history forward", show=False),
        _key("l", "toggle_log", "Log", "show or hide the log (scrolls with ↑/↓ and PgUp/PgDn)"),
        _key("s", "save_svg", "Shot", "save the screen as SVG in the working directory",
             show=False),
        _key("question_mark", "help", "Help", "this list of keys", display="?"),
        _key("q", "request_quit", "Quit", "stop: drain running requests, drop waiting ones (asks)"),
    ]

    stats: reactive[EngineStats] = reactive(NO_STATS)
    history: reactive[StatsHistory] = reactive(StatsHistory())
    paused: reactive[bool] = reactive(False)
    show_log: reactive[bool] = reactive(False)
    selected: reactive[str | None] = reactive(None)
    scroll_back: reactive[int] = reactive(0)
    nvml: reactive[tuple[GpuReading, ...]] = reactive(())

    def __init__(self, supervisor: ConsoleSupervisor, *, title_info: str,
                 gpu_monitor: GpuMonitor | None = None) -> None:
        """`title_info` is one line shown at the header's right, e.g. version and device names;
        `gpu_monitor` gives the memory panel its GPU rows (None: no rows, as in tests)."""
        super().__init__()
        self.supervisor = supervisor
        self.gpu_monitor = gpu_monitor
        self.info = ServerInfo(title_info=title_info, artifact=supervisor.artifact,
                               listen_url=supervisor.listen_url,
                               auth_enabled=supervisor.auth_enabled)

    def compose(self) -> ComposeResult:
        stats = NinferConsole.stats
        yield HeaderPanel(self.info).data_bind(stats, NinferConsole.paused)
        yield FailureBanner().data_bind(stats)
        with Grid(id="panels"):
            with PanelColumn(id="memory-column"):
                yield MemoryPanel().data_bind(stats, NinferConsole.nvml)
                yield StateSlotPanel().data_bind(stats)
                yield VisionPanel().data_bind(stats)
            yield KvPanel().data_bind(stats)
            yield ExpertPanel().data_bind(stats)
            yield SpecPanel().data_bind(stats, NinferConsole.history)
        with Grid(id="middle"):
            yield LatencyPanel().data_bind(stats)
            yield TrendsPanel().data_bind(stats, NinferConsole.history, NinferConsole.scroll_back)
        yield RequestsPanel().data_bind(stats, NinferConsole.selected)
        yield LogPanel()
        yield Footer()

    def on_mount(self) -> None:
        self.poll_supervisor()
        self.set_interval(POLL_INTERVAL_S, self.poll_supervisor)

    def on_resize(self, event: events.Resize) -> None:
        compact = event.size.width < COMPACT_BELOW[0] or event.size.height < COMPACT_BELOW[1]
        self.screen.set_class(compact, "-compact")
        for panel in self.query(Panel):
            panel.compact = compact

    def poll_supervisor(self) -> None:
        """Take the supervisor's latest snapshot; the bound panels follow."""
        if not self.screen_stack:  # the interval can still fire while the app shuts down
            return
        stats = self.supervisor.snapshot()
        self.history = self.history.push(stats)
        self.stats = stats
        if self.gpu_monitor is not None:
            self.nvml = self.gpu_monitor.read()
        self.paused = self.supervisor.paused
        self.screen.set_class(not stats.live, "-stale")  # greyed: nothing here is live
        ids = [view.id for view in selectable(stats)]
        if self.selected not in ids:
            self.selected = ids[0] if ids else None
        if self.show_log:
            # none while another screen is on top or the app is being torn down (a tick can
            # fire then: a race seen in the suite's 80x24 log test)
            for panel in self.query(LogPanel):
                panel.show(self.supervisor.log_lines())

    def watch_show_log(self, show: bool) -> None:
        log = self.query_one(LogPanel)
        if show:
            log.show(self.supervisor.log_lines())
        log.display = show
        self.screen.set_class(show, "-log")

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
        self.push_screen(ConfirmScreen("Reload the engine?", detail),
                         lambda yes: self.start_reload(None, yes))

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

    def action_select(self, step: int) -> None:
        ids = [view.id for view in selectable(self.stats)]
        if ids:
            at = ids.index(self.selected) if self.selected in ids else -step
            self.selected = ids[max(0, min(len(ids) - 1, at + step))]

    def _selected_view(self):
        return next((v for v in selectable(self.stats) if v.id == self.selected), None)

    def action_detail(self) -> None:
        view = self._selected_view()
        if view is not None:
            detail = RequestDetail(view, self.stats.max_context)
            self.push_screen(detail, lambda yes: self.cancel_request(view.id) if yes else None)

    def action_cancel_selected(self) -> None:
        view = self._selected_view()
        if view is None or view.phase not in ("queued", "paused", "prefill", "decode"):
            self.notify("No running or waiting request is selected.", severity="warning")
            return
        question = f"Cancel request {view.id}?"
        self.push_screen(ConfirmScreen(question, "Its client gets a 503 error."),
                         lambda yes: self.cancel_request(view.id) if yes else None)

    def cancel_request(self, request_id: str) -> None:
        if self.supervisor.cancel(request_id):
            self.notify(f"Cancelled {request_id}.")
        else:
            self.notify(f"{request_id} had already ended.", severity="warning")

    def action_scroll_history(self, direction: int) -> None:
        oldest = max(len(self.history.buckets) - 10, 0)
        self.scroll_back = max(0, min(oldest, self.scroll_back + direction * SCROLL_STEP))

    def action_save_svg(self) -> None:
        """Write the screen to `ninfer-console-<time>.svg` in the working directory (what
        scripts/console_screenshot.py collects), without the toasts on it: after the next
        refresh, once they are cleared."""
        self.clear_notifications()
        self.call_after_refresh(self._save_svg)

    def _save_svg(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S") + f"{time.time() % 1:.3f}"[1:]
        try:
            path = self.save_screenshot(f"ninfer-console-{stamp}.svg", path=os.getcwd())
        except OSError as exc:
            self.notify(f"Screenshot not saved: {exc}", severity="error")
            return
        self.notify(f"Saved {path}")

    def action_toggle_log(self) -> None:
        self.show_log = not self.show_log

    def action_help(self) -> None:
        keys = [(b.key_display or b.key, b.description, b.tooltip) for b in self.BINDINGS
                if b.key != "down" and b.key != "]"]
        self.push_screen(HelpScreen(keys))

    def action_request_quit(self) -> None:
        queue = self.stats.queue
        if not (queue.running or queue.pending):
            self.quit_gracefully()
            return
        drain = f"{self.supervisor.drain_s:g} s"
        question = (f"{len(queue.running)} running, {len(queue.pending)} waiting. Quit?")
        detail = (f"Requests in the engine get up to {drain} to finish, then end with a 503 "
                  "error; requests waiting at a paused gate are answered 503 at once.")
        self.push_screen(ConfirmScreen(question, detail),
                         lambda yes: self.quit_gracefully() if yes else None)

    async def action_quit(self) -> None:
        """ctrl+q, Textual's own quit key: the same question and drain as `q`."""
        self.action_request_quit()

    def quit_gracefully(self) -> None:
        """Stop; the serving console drains the server first (`console.ServingConsole`)."""
        self.exit()
