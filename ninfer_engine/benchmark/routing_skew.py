"""Skewed routing for random-weight MoE models: router rows scaled by a popularity profile.

A random router gives every expert the same chance (uniform routing), which real models do
not: a few experts take most tokens. `skewed_routers(source, s)` scales router row e by
rank(e)^(-s) over a seeded random permutation of each layer's experts. Top-k picks the largest
logits, and a row of larger norm reaches the upper tail far more often, so popularity follows
the ranks. For iid Gaussian hiddens, 512 experts, top-10 and s = 0.3 the hottest 5 % / 20 % /
50 % of the experts take 40 % / 76 % / 94 % of the routed pairs (Zipf s = 1.0 over 512: 57 % /
76 % / 90 %); a served run measures its own (`LayerTier.routed`).
"""
from __future__ import annotations

import zlib

import torch


def skewed_routers(source, s: float, seed: int = 0):
    """`source` with every `.../moe/router` [E, H] scaled per row by rank^(-s)."""
    if s == 0:
        return source

    def params(name, shape):
        w = source(name, shape)
        if not name.endswith("/moe/router"):
            return w
        gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
        ranks = torch.randperm(shape[0], generator=gen).to(torch.float64) + 1
        return (w.double() * (ranks ** -s)[:, None].to(w.device)).to(w.dtype)

    return params


def top_share(counts: list[int], fraction: float) -> float:
    """Share of the routed pairs that go to the `fraction` most popular experts."""
    ordered = sorted(counts, reverse=True)
    total = sum(ordered)
    return sum(ordered[: max(1, round(fraction * len(ordered)))]) / total if total else 0.0
