"""Lazy access to a Hugging Face safetensors checkpoint directory.

`HfCheckpoint` reads `config.json` and the tensor directory of `model.safetensors.index.json`
(or of every `*.safetensors` file) without loading any tensor; tensors are read one at a time
(`tensor`) or in row blocks (`row_blocks`) through `safetensors.safe_open`. Each read opens and
closes its file, so the pages it touched are unmapped again (a handle kept open would keep
every page read so far resident). `LazyTensors` is a pop-on-demand mapping the per-layer name
transforms of `artifact.hf_names` can consume, so a converter holds at most one layer's tensors.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import ArtifactError
from .legacy_names import VISION_ROLES as VISION_RESOURCE_FILES

# resource role -> file name in the checkpoint directory (the vision component's in
# VISION_RESOURCE_FILES)
RESOURCE_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                  "chat_template.jinja", *VISION_RESOURCE_FILES)


class HfCheckpoint:
    """The config and the tensor directory of one checkpoint folder."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        config_path = self.folder / "config.json"
        if not config_path.is_file():
            raise ArtifactError("no config.json (not a Hugging Face checkpoint folder)")
        self.config = json.loads(config_path.read_text())
        self._files = self._weight_map()

    @property
    def names(self) -> list[str]:
        return list(self._files)

    def shape(self, name: str) -> tuple[int, ...]:
        with self._open(name) as handle:
            return tuple(handle.get_slice(name).get_shape())

    def tensor(self, name: str) -> torch.Tensor:
        """One tensor, read now (a private copy, not a view of the mmap)."""
        with self._open(name) as handle:
            return handle.get_tensor(name)

    def row_blocks(self, name: str, max_elements: int = 1 << 25) -> Iterator[torch.Tensor]:
        """The tensor in consecutive blocks along its first dimension."""
        shape = self.shape(name)
        rows, step = shape[0], max(1, max_elements // max(1, math.prod(shape[1:])))
        for r0 in range(0, rows, step):
            with self._open(name) as handle:
                yield handle.get_slice(name)[r0 : min(rows, r0 + step)]

    def resources(self) -> dict[str, bytes]:
        """Tokenizer, tokenizer config, generation config, chat template and the image / video
        preprocessor configs found in the folder.

        A template stored only inside `tokenizer_config.json` becomes `chat_template.jinja`.
        """
        out = {}
        for role in RESOURCE_FILES:
            path = self.folder / role
            if path.is_file():
                out[role] = path.read_bytes()
        if "chat_template.jinja" not in out and "tokenizer_config.json" in out:
            template = json.loads(out["tokenizer_config.json"]).get("chat_template")
            if isinstance(template, str):
                out["chat_template.jinja"] = template.encode()
        return out

    def _weight_map(self) -> dict[str, str]:
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            return dict(json.loads(index.read_text())["weight_map"])
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise ArtifactError("no *.safetensors files")
        out = {}
        for path in files:
            with safe_open(path, "pt") as handle:
                out.update({name: path.name for name in handle.keys()})
        return out

    @contextmanager
    def _open(self, name: str):
        file = self._files.get(name)
        if file is None:
            raise ArtifactError(f"checkpoint has no tensor {name}")
        with safe_open(self.folder / file, "pt") as handle:
            yield handle


class LazyTensors:
    """A mapping of short names to checkpoint tensors that are read when popped."""

    def __init__(self, checkpoint: HfCheckpoint, names: dict[str, str]) -> None:
        self._checkpoint = checkpoint
        self._names = dict(names)  # short name -> full checkpoint name

    def __contains__(self, short: object) -> bool:
        return short in self._names

    def pop(self, short: str) -> torch.Tensor:
        if short not in self._names:
            raise ArtifactError(f"checkpoint lacks tensor {short}")
        return self._checkpoint.tensor(self._names.pop(short))

    def left(self) -> list[str]:
        """Full names of the tensors nobody consumed."""
        return sorted(self._names.values())
