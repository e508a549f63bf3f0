"""`ExpertTiers`: the offloaded routed experts of a model, and how they join the model.

Built at load (`build_tiers`) before the model: the placement (`placement`) from the budget
and one real expert's served bytes, the RAM guard, the host store (`HostExperts`) filled
expert by expert from the model's parameter source, one `LayerTier` per MoE layer, and the
miss costs measured on the first layer (`cost_model.measure`). The model is then built over
`placeholders(source)`, which hands out meta tensors for the routed experts (no memory:
nothing reads them once `install` has given each `SparseMoE` its tier, and any stray read
fails loudly); on CUDA `FusedParams` takes the tier's slot stacks as the layer's expert stacks.

Lending (`--elastic`, `lend`): the part of the elastic KV pool's capacity it has not grown into
becomes extra slots, one slot in every MoE layer per `unit_pages` pages
(`kv.pages.ElasticPagePool.lend`); KV growth takes them back first (`give_back`: the policy's
victims evicted, the slot stacks shrunk), so lending never fails a lease.
"""
from __future__ import annotations

import itertools
import math

import torch

from ..kernels.cpu_experts import takes
from ..kernels.moe_dequant import scale_layout
from ..stats import ExpertStats
from .cost_model import best_seconds, measure, row_dtype
from .handoff_policy import HandoffPolicy, split_seconds
from .host_store import ExpertGetter, HostExperts
from .in_place import InPlaceReads, Tables
from .placement import ExpertPlacement
from .slot_cache import POLICIES
from .tier import LayerTier, empty_slots


def expert_name(layer: int, e: int, member: str) -> str:
    return f"text/layers/{layer}/moe/experts/{e}/{member}"


AUTO_EXPERTS = 5  # experts a call when `auto` times the cores (half a uniform top-10's misses)
# host memory `auto` reads to time host DRAM: past the H100 host's 300 MiB last-level cache
AUTO_READ_BYTES = 512 << 20
SPLIT_SIZE = 1024  # a split's entries (misses a layer-step); more misses read the last one
# what a layer's host job adds to its own time: the kernels' post → worker → done round trip,
# 19.1 µs on the H200's host, 19.7 on an H100's (bench/results/h*-host-contention.json)
HANDOFF_S = 20e-6


def balanced_count(misses: int, fixed: float, per_expert: float, bus: float,
                   dram: float | None = None) -> int:
    """How many of a layer-step's `misses` the host computes so that the layer is fastest:
    the c minimising max(fixed·[c > 0] + c·per_expert, (misses − c)·bus, misses·dram),
    seconds of the host job, of the bus's in-place reads, and of reading every missed expert
    from host DRAM, which both sides share (`dram` an expert, no slower than either side alone;
    None: the faster side's; 0: none); the smallest such c (a few misses stay on the bus: the
    job's fixed cost outlasts reading them)."""
    def cost(c: int) -> float:
        return split_seconds(misses, c, fixed, per_expert, bus, dram)
    near = int((misses * bus - fixed) // (per_expert + bus))  # where the two sides cross
    best = min((c for c in (0, near, near + 1) if 0 <= c <= misses), key=lambda c: (cost(c), c))
    # at DRAM's bound fewer may do as well: the fewest whose bus side fits in the best time
    fewest = max(0, math.ceil(misses - cost(best) / bus))
    return fewest if fewest < best and cost(fewest) <= cost(best) else best


class ExpertTiers:
    """See the module docstring."""

    def __init__(self, config: dict, placement: ExpertPlacement, get: ExpertGetter, device,
                 miss: str = "auto", policy: str = "lfu", prefetch: bool = False,
                 cpu_share: float | str | None = None) -> None:
        self.placement = placement
        self.device = torch.device(device)
        width, hidden = config["moe_intermediate_size"], config["hidden_size"]
        E = placement.experts
        self.host = HostExperts(get, placement.layers, E, width, hidden,
                                pin=self.device.type == "cuda")
        self.layers = {i: LayerTier(self.host.stacks[i], placement.slots, width, self.device,
                                    POLICIES[policy](E), miss) for i in placement.layers}
        first = self.layers[placement.layers[0]]
        scratch = tuple(empty_slots(s, 1, self.device) for s in (first.host_gu, first.host_down))
        self.costs = measure((first.host_gu, first.host_down), scratch, first.cpu_expert)
        for tier in self.layers.values():
            tier.costs = self.costs
        # misses read in place by the captured step (`in_place`): every form but group scales
        # (Q4/Q5), whose kernels take no `Remap`; `auto` prefers it to a host sync a layer
        self.cpu_share = 0.0
        self.auto_seconds: dict[str, float] = {}  # `auto`'s costs of a layer-step's misses
        self.handoff: HandoffPolicy | None = None  # `auto`'s: whether the step hands misses
        if miss in ("read", "auto") and all(scale_layout(s.w, s.scale)[0] < 2
                                            for s in (first.host_gu, first.host_down)):
            tables = Tables(len(self.layers), E, self.device)
            for row, tier in enumerate(self.layers.values()):
                tier.in_place = InPlaceReads(tier, tables, row)
            split = self.host_split(cpu_share, first)
            if split is not None:
                for tier in self.layers.values():
                    tier.in_place.hand_misses(split, self.handoff)
        self.prefetch = prefetch
        self.lent_pages = 0
        self.unit_pages = 0  # pages a lent slot (one in every MoE layer) takes
        self.generation = 0  # bumped when lending reallocates the slot stacks (recapture)

    def host_split(self, asked: float | str | None, first: LayerTier) -> torch.Tensor | None:
        """How many of a layer-step's m missed pairs the captured step computes on the host's
        cores (`InPlaceReads.hand_misses`), for each m: none unless asked
        (`--expert-cpu-share F|auto`); F: round(F·m); `auto`: `balanced_count` of the host
        job's costs timed here (`host_costs`) against the bus's host → slot copy (`costs`),
        over host DRAM's read (`host_read_seconds`).
        `cpu_share`: F, or `auto`'s share of many misses. fp8-row experts only where the
        step runs on CUDA (the compiled kernel's form)."""
        if not asked:
            return None
        if self.device.type == "cuda" and not takes(first.host_gu, first.host_down):
            raise ValueError("--expert-cpu-share: the host's expert kernel takes fp8-row "
                             "experts only (this artifact's routed experts are not)")
        if asked == "auto":
            fixed, per_expert = self.host_costs(first)
            bus = first.expert_bytes / self.costs.copy_bytes_per_s
            read = first.expert_bytes * self.host_read_seconds()
            # a read slower than either side alone timed torch, not DRAM (that side has just
            # read it faster): no floor. On an H100 host it timed 68.7+ µs an expert beside a
            # 68.7 µs bus and cores of 77.1, where half the misses on the cores ran 1.48x the
            # bus alone (h100-expert-offload-auto-floor.md)
            dram = read if read < min(per_expert, bus) else 0.0
            # (`balanced_count` as m grows: where the two sides cross, or DRAM's floor first)
            self.cpu_share = max(0.0, min(bus / (per_expert + bus), 1 - dram / bus))
            self.auto_seconds = dict(fixed=fixed + HANDOFF_S, per_expert=per_expert, bus=bus,
                                     dram=dram)
            counts = [balanced_count(m, fixed + HANDOFF_S, per_expert, bus, dram)
                      for m in range(SPLIT_SIZE)]
            self.handoff = HandoffPolicy(counts, fixed + HANDOFF_S, per_expert, bus,
                                         len(self.layers), dram=dram)
        elif not 0 < asked <= 1:
            raise ValueError(f"--expert-cpu-share {asked}: a share of the experts, in (0, 1]")
        else:
            self.cpu_share = asked
            counts = [math.floor(asked * m + 0.5) for m in range(SPLIT_SIZE)]
        return torch.tensor(counts, dtype=torch.int32, device=self.device)

    def host_costs(self, first: LayerTier) -> tuple[float, float]:
        """(fixed, per expert) seconds of a layer's host job: the best of three calls of one
        expert and of `AUTO_EXPERTS` on one row, at the worker's team size
        (`host_jobs.default_threads`), in the step's row dtype, each call on experts no
        earlier call read (a step's misses come from memory: five repeated experts, 16 MB,
        stayed in the H100 host's 300 MiB last-level cache, where they read at 1.6x the
        cores' rate from memory). The compiled job is timed by its own clock
        (`host_jobs.job_seconds`: a call's Python, ~24 µs, is no part of a layer-step's
        job), other forms (the CPU reference's) around `cpu_sum`."""
        from .host_jobs import default_threads, job_seconds  # (host_jobs builds on tiers)
        E = self.placement.experts
        n = min(AUTO_EXPERTS, E)
        unread = itertools.cycle(range(E))
        dtype, threads = row_dtype(self.device), default_threads()
        x = torch.zeros(1, first.host_down.w.shape[1], dtype=dtype)

        def seconds(count: int) -> float:
            experts = [next(unread) for _ in range(count)]
            if first.compiled:
                return job_seconds(first, experts, dtype, threads)
            return best_seconds(lambda: first.cpu_sum(x, [0] * count, experts, [1.0] * count,
                                                      threads=threads), repeats=1)
        seconds(1)  # warm: the first call also starts the team
        one = min(seconds(1) for _ in range(3))
        many = min(seconds(n) for _ in range(3))
        per_expert = max((many - one) / max(n - 1, 1), 1e-9)
        return max(one - per_expert, 0.0), per_expert

    def host_read_seconds(self) -> float:
        """Seconds a byte of host DRAM takes to read at DRAM's own rate: torch's threads
        summing the last `AUTO_READ_BYTES` of the host store as int64 words (the last layers'
        experts: `host_costs` read the first layer's), the best of three. The split's floor:
        the bus and the cores read the same DRAM, which torch reads at 100-131 GB/s on the H100
        hosts (bench/results/h100-host-cpu-expert-kernel-16.md); taken as the cores' own rate,
        timed at 74-113 GB/s (42.8-27.8 µs an expert) in different leases, it gave them 0.35-0.58
        of the misses, and half off, uniform, B = 1 ran 250-296 tok/s
        (h100-expert-offload-peer-split.md, h100-expert-offload-split-auto.md)."""
        buffer = self.host.buffer
        start = -(-max(0, buffer.numel() - AUTO_READ_BYTES) // 8) * 8  # (int64-aligned)
        n = (buffer.numel() - start) // 8 * 8
        words = buffer[start: start + n].view(torch.int64)
        return best_seconds(words.sum) / max(n, 1)

    @property
    def capturable(self) -> bool:
        """Whether the decode step runs without a host sync (every layer reads in place)."""
        return all(t.in_place is not None for t in self.layers.values())

    # -- building the model -------------------------------------------------------------

    def tier(self, moe_key: str) -> LayerTier | None:
        """The tier of `text/layers/i/moe/`'s routed experts, None where they are not in one."""
        return self.layers.get(int(moe_key.split("/")[2]))

    def placeholders(self, source):
        """`source` with every routed expert of the tiers replaced by a meta tensor."""
        def get(name: str, shape: tuple[int, ...]):
            if "/moe/experts/" in name and self.tier(name.split("experts/")[0]) is not None:
                return torch.empty(shape, device="meta")
            return source(name, shape)
        return get

    def install(self, model) -> None:
        """Give each offloaded `SparseMoE` its tier; the model keeps the tiers for the stats."""
        for i, tier in self.layers.items():
            model.blocks[i].ffn.tier = tier
        if self.prefetch:  # each layer guesses the next one's experts with its router
            order = sorted(self.layers)
            for i, j in zip(order, order[1:]):
                self.layers[i].next = self.layers[j]
                self.layers[i].next_router = model.blocks[j].ffn.router
        model.expert_tiers = self

    # -- lending ---------------------------------------------------------------------------

    def lend(self, pool, page_bytes: int) -> None:
        """Borrow every page of `pool`'s capacity not grown into, as whole lent slots."""
        self.unit_pages = math.ceil(len(self.layers) * self.placement.expert_bytes / page_bytes)
        units = pool.lend_room() // self.unit_pages
        free = self.placement.experts - self.placement.slots - self.lent_pages // max(
            self.unit_pages, 1)
        units = min(units, free)  # never more slots than experts
        if units > 0:
            pool.lend(units * self.unit_pages, self.give_back)
            self.lent_pages += units * self.unit_pages
            self._resize()

    def give_back(self, pages: int) -> int:
        """Return at least `pages` lent pages (all of them if fewer): the pages returned."""
        units = min(math.ceil(pages / self.unit_pages), self.lent_pages // self.unit_pages)
        self.lent_pages -= units * self.unit_pages
        self._resize()
        if self.device.type == "cuda":  # the slots' blocks go back for the KV to grow into
            torch.cuda.empty_cache()
        return units * self.unit_pages

    def _resize(self) -> None:
        slots = self.placement.slots + self.lent_pages // max(self.unit_pages, 1)
        for tier in self.layers.values():
            tier.resize(slots)
        self.generation += 1

    # -- stats ---------------------------------------------------------------------------

    def stats(self, base: ExpertStats) -> ExpertStats:
        """`base` (the model's shape) with the tiers' slots, counters and lending."""
        tiers = self.layers.values()
        cached = sum(sum(e >= 0 for e in t.map.held) for t in tiers)
        device = sum(t.device_pairs for t in tiers)
        cpu = sum(t.cpu_pairs for t in tiers)
        return ExpertStats(
            slots=sum(t.map.slots for t in tiers), resident=cached, cached=cached,
            lent_pages=self.lent_pages, hits=sum(t.map.hits for t in tiers),
            misses=sum(t.map.misses for t in tiers),
            cpu_share=cpu / (cpu + device) if cpu + device else 0.0,
            bytes_copied=sum(t.bytes_copied for t in tiers), experts=base.experts,
            cpu_layers=sum(t.in_place is not None and t.in_place.handing for t in tiers),
            active=base.active, layers=base.layers)

    @property
    def device_bytes(self) -> int:
        """Bytes of the device slots (lent ones included, and shared experts held as one)."""
        return sum(t.rows * t.expert_bytes for t in self.layers.values())
