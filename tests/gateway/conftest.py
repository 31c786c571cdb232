"""Fixtures shared by the gateway's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.store import Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A store on a fresh SQLite file (test files that need PostgreSQL too define their own)."""
    s = await Store.open(f"sqlite:///{tmp_path}/state.db")
    yield s
    await s.close()
