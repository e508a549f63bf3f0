"""`HandoffPolicy`: whether `--expert-cpu-share auto`'s captured step carries the hand-off.

`auto`'s split (`tiers.balanced_count`) gives the host's cores a share of a layer-step's m
missed pairs only where that beats the bus alone, but the step's four hand-off kernels
(`kernels.host_handoff`) launch in every offloaded layer whatever m turns out to be: on the
H100, 25 % of the experts in host RAM under skewed routing, `auto` ran 709.2 tok/s against the
bus alone's 769.4 with the split handing the cores 0.5 % of the pairs, ~7 µs a layer-step
(bench/results/h100-expert-offload-split-auto.md). So every `WINDOW` steps the policy weighs
what the split saved over the window's layer-steps (each one's bus-only time less the
split's, from the costs `auto` timed at load) against those launches, and after two windows in
a row on the other side it switches: off, the step is captured without the hand-off (every
miss read in place over the bus); on, with it. The decode graphs of both forms stay cached
(`DecodeGraphs` keys them by the decoder's `graph_form`; the form without the hand-off is
captured the first time a shape runs in it), so switching back costs no capture.
"""
from __future__ import annotations

import logging

log = logging.getLogger("ninfer.engine")

# the hand-off kernels' cost a layer-step when they hand nothing over (see the docstring)
LAUNCH_S = 7e-6
WINDOW = 256  # steps a decision weighs
AGAINST = 2  # windows in a row that must disagree with the current form before it switches


def split_seconds(misses: int, count: int, fixed: float, per_expert: float,
                  bus: float, dram: float | None = None) -> float:
    """A layer-step of `misses` missed pairs, `count` of them on the host's cores: the
    slowest of the host job (its `fixed` cost where it has any), the bus's in-place reads of
    the rest, and host DRAM reading every one, which both sides share: `dram` seconds an
    expert (None: the faster side's alone; 0: no floor)."""
    floor = min(per_expert, bus) if dram is None else dram
    return max(fixed * (count > 0) + count * per_expert, (misses - count) * bus,
               misses * floor)


class HandoffPolicy:
    """Decides `on` from the layer-steps' missed pairs (`observe`, once a layer a step): the
    split's `counts` (host pairs for m misses, m past the end reading the last) and the
    seconds `auto` timed (a host job's `fixed` cost, `per_expert` on the cores, `bus` per
    expert read in place, `dram` per expert from host DRAM: `split_seconds`) over `layers`
    offloaded layers."""

    def __init__(self, counts: list[int], fixed: float, per_expert: float, bus: float,
                 layers: int, launch: float = LAUNCH_S, window: int = WINDOW,
                 dram: float | None = None) -> None:
        self.counts = counts
        self.costs = fixed, per_expert, bus, dram
        self.launch = launch
        self.span = window * max(layers, 1)  # layer-steps a window
        self.on = True
        self.switches = 0
        self._seen = 0
        self._saved = 0.0  # seconds the split saved over the window's layer-steps
        self._against = 0

    def saving(self, misses: int) -> float:
        """Seconds the split saves a layer-step of `misses` missed pairs against the bus
        alone (`split_seconds`, `balanced_count`'s model; 0 where it hands the cores none)."""
        c = self.counts[min(misses, len(self.counts) - 1)]
        return split_seconds(misses, 0, *self.costs) - split_seconds(misses, c, *self.costs)

    def observe(self, misses: int) -> None:
        """One layer-step's missed pairs; at a window's end, the decision."""
        self._saved += self.saving(misses)
        self._seen += 1
        if self._seen < self.span:
            return
        net = self._saved / self._seen - self.launch  # seconds a layer-step the hand-off pays
        self._seen, self._saved = 0, 0.0
        if (net > 0) == self.on:
            self._against = 0
            return
        self._against += 1
        if self._against >= AGAINST:
            self.on, self._against = not self.on, 0
            self.switches += 1
            log.info("expert hand-off to the host's cores %s: it %s %.1f µs a layer-step "
                     "against its kernels' %.1f", "on" if self.on else "off",
                     "saves" if self.on else "saved only", (net + self.launch) * 1e6,
                     self.launch * 1e6)
