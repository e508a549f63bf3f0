"""The process-local Response store behind `previous_response_id`, GET, DELETE and input_items.

An LRU bounded by `--response-store-max-records` and `--response-store-max-mib` (contract §6
"Store"); lost on restart. A record is self-contained: it holds the whole conversation up to and
including its own output, so evicting an older turn never breaks a newer continuation. Sizes are
the records' JSON length, an upper bound of their memory (message dicts are shared between the
turns of one conversation).
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError

MIB = 1024 * 1024


@dataclass
class StoredResponse:
    """One stored Response and what a continuation or the input_items listing needs."""

    response: dict[str, Any]  # the Response object as it was returned
    input_items: list[dict[str, Any]]  # every item used to generate it (earlier turns too)
    conversation: tuple[dict[str, Any], ...]  # template messages incl. the output, no instructions
    session_key: str  # the root response's id: the engine's prefix-reuse hint for the chain
    preserve_thinking: bool | None  # the root's setting, inherited by continuations
    size: int = field(default=0)

    @property
    def id(self) -> str:
        return self.response["id"]


def json_size(*parts: Any) -> int:
    """Bytes of the parts' compact JSON encoding."""
    return sum(len(json.dumps(p, ensure_ascii=False, separators=(",", ":")).encode())
               for p in parts)


def capacity_exceeded(size: int, budget: int) -> ApiError:
    return ApiError(400, f"This response needs {size} bytes of the response store; its budget is "
                    f"{budget} bytes. Send store=false or a shorter conversation.",
                    "response_store_capacity_exceeded", param="store")


class ResponseStore:
    """Least-recently-used records within a record count and a byte budget."""

    def __init__(self, max_records: int, max_mib: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_mib * MIB
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def check_fits(self, size: int) -> None:
        """400 `response_store_capacity_exceeded` when one record of `size` bytes can never fit."""
        if size > self.max_bytes or self.max_records < 1:
            raise capacity_exceeded(size, self.max_bytes)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The record (now most recently used), or 404 `response_not_found`."""
        record = self._records.get(response_id)
        if record is None:
            raise ApiError(404, f"No response with id '{response_id}' is stored.",
                           "response_not_found", param=param)
        self._records.move_to_end(response_id)
        return record

    def put(self, record: StoredResponse) -> None:
        """Store `record`, evicting the least recently used ones until both limits hold."""
        record.size = json_size(record.response, record.input_items, record.conversation)
        self.check_fits(record.size)
        self._drop(record.id)
        self._records[record.id] = record
        self._bytes += record.size
        while len(self._records) > self.max_records or self._bytes > self.max_bytes:
            self._drop(next(iter(self._records)))

    def delete(self, response_id: str) -> None:
        """Remove the record, or 404 `response_not_found`."""
        self.get(response_id)
        self._drop(response_id)

    def _drop(self, response_id: str) -> None:
        record = self._records.pop(response_id, None)
        if record is not None:
            self._bytes -= record.size
