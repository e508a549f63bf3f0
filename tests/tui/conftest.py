"""Console tests run their async bodies through anyio's pytest plugin, on asyncio only."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
