"""Model-like logits for the grammar-mask benchmark (bench/mask_cost.py).

A real model writing a JSON answer mostly knows what comes next: its logits peak at one token,
and its strings end after a few words. Random logits do not: under a JSON grammar they keep a
row inside a free string for as long as the schema allows, where llguidance must check every
one of the 248K tokens for each mask. `Teacher` gives each row a valid document of the schema
(random values, the grammar's own separators) and logits that peak (+MARGIN over N(0, 1) noise)
at the document's next token, so the sampled output walks through the states a model writing
that document would visit; `random` mode is the old worst case (N(0, 3²) noise, no peak). A row
whose output left its document (a token the grammar refuses, which the mask then replaces) gets
noise only from there on, and is counted (`desynced`).

The noise comes from a pool of pre-drawn tensors (drawing 8 × 248K normals takes milliseconds on
a CPU, which would count as forward time); the peaks are written in place and undone before the
tensor is handed out again.
"""
from __future__ import annotations

import json
import random

import torch

MARGIN = 15.0  # over N(0, 1) noise: the peak's probability is ~1 at temperature 1
POOL = 8
NAMES = ["Ada", "Grace Hopper", "Linus", "Émilie du Châtelet", "Alan", "Katherine J."]
CITIES = ["Paris", "São Paulo", "Reykjavík", "New York", "Kyoto", "Cape Town"]
COUNTRIES = ["France", "Brazil", "Iceland", "United States", "Japan", "South Africa"]
TAGS = ["math", "navy", "compilers", "physics", "space", "tea", "chess"]


def document(rng: random.Random) -> str:
    """A valid instance of mask_cost.SCHEMA in the grammar's style (", " and ": ")."""
    value = {"name": rng.choice(NAMES), "age": rng.randint(0, 150),
             "favourite": rng.choice(["red", "green", "blue"]),
             "address": {"city": rng.choice(CITIES), "country": rng.choice(COUNTRIES)},
             "tags": rng.sample(TAGS, rng.randint(0, 3))}
    return json.dumps(value, ensure_ascii=False)


class Teacher:
    """Logits [len(rows), columns] on `device` for rows keyed by any hashable id, each row's
    next token read from its output so far (`logits(keys, outputs)`)."""

    def __init__(self, encode, eos: int, columns: int, batch: int, device, mode: str = "teacher",
                 seed: int = 0) -> None:
        self.encode, self.eos, self.mode = encode, eos, mode
        self.rng = random.Random(seed)
        gen = torch.Generator(device=device).manual_seed(seed)
        scale = 1.0 if mode == "teacher" else 3.0
        self.pool = [torch.randn((batch, columns), generator=gen, device=device) * scale
                     for _ in range(POOL)]
        self.turn = 0
        self.docs: dict = {}
        self.desynced: set = set()
        self.followed = 0  # tokens sampled as the document had them
        self._undo: list = []

    def forget(self, key) -> None:
        self.docs.pop(key, None)
        self.desynced.discard(key)

    def logits(self, keys: list, outputs: list[list[int]]) -> torch.Tensor:
        for tensor, row, column in self._undo:
            tensor[row, column] -= MARGIN
        self._undo = []
        out = self.pool[self.turn % POOL][: len(keys)]
        self.turn += 1
        if self.mode != "teacher":
            return out
        for row, (key, output) in enumerate(zip(keys, outputs)):
            if key not in self.docs:
                self.docs[key] = [*self.encode(document(self.rng)), self.eos]
            doc = self.docs[key]
            if output and (len(output) > len(doc) or output[-1] != doc[len(output) - 1]):
                self.desynced.add(key)
            elif output:
                self.followed += 1
            if key in self.desynced or len(output) >= len(doc):
                continue
            target = doc[len(output)]
            out[row, target] += MARGIN
            self._undo.append((out, row, target))
        return out
