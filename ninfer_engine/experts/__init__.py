"""Routed experts beyond the device: placement from a budget, the host store, the device
expert-slot cache, misses on the CPU or copied in, and KV-page lending (issue 20)."""
from .loading import expert_tiers_for, offloading
from .placement import ExpertPlacement, RamGuardError, check_ram_guard, plan_placement
from .slot_cache import LfuAgingPolicy, LruPolicy, SlotMap
from .tier import LayerTier
from .tiers import ExpertTiers

__all__ = ["ExpertPlacement", "ExpertTiers", "LayerTier", "LfuAgingPolicy", "LruPolicy",
           "RamGuardError", "SlotMap", "check_ram_guard", "expert_tiers_for", "offloading",
           "plan_placement"]
