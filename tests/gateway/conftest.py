"""Fixtures shared by the gateway's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.config import parse_config
from gateway.sim.model_server import ScriptedModel
from gateway.sim.telegram_api import TelegramSimulator
from gateway.store import Store
from tests.conftest import base_config, deep_merge


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A store on a fresh SQLite file (test files that need PostgreSQL too define their own)."""
    s = await Store.open(f"sqlite:///{tmp_path}/state.db")
    yield s
    await s.close()


StartTelegramGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def telegram_gateway(tmp_path: Path) -> AsyncIterator[StartTelegramGateway]:
    """Start gateways with the real Telegram adapter against a Telegram simulator and a scripted model (both
    the test's), config overrides merged in; every one started is stopped at teardown."""
    started: list[Gateway] = []

    async def start(sim: TelegramSimulator, model: ScriptedModel,
                    overrides: Mapping[str, Any] | None = None) -> Gateway:
        raw = deep_merge(base_config(tmp_path, model.base_url or "", "http://127.0.0.1:9/results"), {
            "platforms": {"telegram": {"enabled": True, "token": sim.token, "base_url": sim.base_url,
                                       "base_file_url": sim.base_file_url}}})
        cfg = parse_config(deep_merge(raw, overrides or {}), env={"HERMES_GATEWAY_HOME": str(tmp_path)})
        gateway = Gateway(cfg)
        started.append(gateway)
        await gateway.start()
        return gateway

    yield start
    for gateway in started:
        await gateway.stop(drain_timeout=1)
