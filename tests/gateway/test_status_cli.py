"""Readiness, ``GET /api/status`` and ``hermes-gateway status``: against a gateway subprocess whose Telegram is
down, with a wrong token, with nothing listening; the store's work counts on SQLite and PostgreSQL; draining."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.cron_store import CronStore
from gateway.sim.model_server import ScriptedModel, text
from gateway.status import WorkCounts, work_counts
from gateway.store import NewRun, OutboxPart, RunCompletion, Store
from platforms.webhook_signatures import sign
from tests.gateway_process import GatewayProcess
from tools.cronjob_tools import CronJob, parse_schedule, resolve_timezone

TOKEN = "status-api-token"
SECRET = "status-webhook-secret-0123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _cli(*args: str, home: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HERMES_GATEWAY_HOME": str(home)})
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _config(path: Path, home: Path, model_url: str, *, port: int, token: str, telegram_port: int) -> Path:
    path.write_text(yaml.safe_dump({
        "model": {"base_url": model_url, "api_key": "k", "name": "scripted-model", "max_retries": 0,
                  "stream": False},
        "http": {"host": "127.0.0.1", "port": port, "api_token": token},
        "store": {"url": f"sqlite:///{home}/state.db"},
        "gateway": {"drain_timeout": 1, "workspace": str(home / "workspace")},
        "auth": {"platforms": {"telegram": {"allowed_users": ["1"]}}},
        "platforms": {
            # Nothing listens there: Telegram stays down for the whole test.
            "telegram": {"enabled": True, "token": "123:not-reachable", "base_url": f"http://127.0.0.1:{telegram_port}/bot"},
            "webhook": {"routes": {"github": {"secret": SECRET, "scheme": "github", "prompt": "Push {payload.ref}"}}},
        },
    }))
    return path


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """A gateway subprocess on a port named in its config, its Telegram pointed at a closed port."""
    model = ScriptedModel(lambda _request: text("pushed"))
    await model.start()
    port = _free_port()
    config = _config(tmp_path / "config.yaml", tmp_path, model.base_url or "", port=port, token=TOKEN,
                     telegram_port=_free_port())
    gateway = GatewayProcess(config, tmp_path)
    await gateway.start()
    assert gateway.port == port
    async with aiohttp.ClientSession() as http:
        yield {"gateway": gateway, "config": config, "http": http, "home": tmp_path, "model": model}
    await gateway.terminate()
    await model.stop()


async def test_readyz_stays_ready_while_telegram_is_down_and_webhooks_still_run(running: dict[str, Any]) -> None:
    gateway, http = running["gateway"], running["http"]
    async with http.get(f"{gateway.url}/readyz") as r:
        ready = await r.json()
        assert r.status == 200 and ready["ready"] is True and ready["store"] == "ok" and ready["draining"] is False
    telegram = ready["platforms"]["telegram"]
    assert telegram["state"] in ("connecting", "failed")  # reported, not gating
    assert ready["platforms"]["webhook"]["state"] == "connected"
    body = json.dumps({"ref": "refs/heads/main"}).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
               **sign("github", SECRET, body, delivery_id="d-1")}
    async with http.post(f"{gateway.url}/webhooks/github", data=body, headers=headers) as r:
        assert r.status == 202


async def test_status_prints_readiness_platforms_and_counts(running: dict[str, Any]) -> None:
    gateway, config, home = running["gateway"], running["config"], running["home"]
    await _wait_telegram_error(running)
    code, out, err = await _cli("status", "--config", str(config), home=home)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("hermes-gateway ") and f"at {gateway.url}: ready (store ok), up 0:00:" in lines[0]
    assert lines[1].startswith("platforms: telegram ") and "unreachable" in lines[1]
    assert "webhook connected" in lines[1]
    assert lines[2:6] == ["runs: 0 running, 0 queued", "cron: 0 active jobs, 0 due",
                          "outbox: 0 parts pending, 0 in doubt", lines[5]]
    assert lines[5].startswith("tool sandbox: ")

    code, out, err = await _cli("status", "--json", "--config", str(config), home=home)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["url"] == gateway.url and summary["ready"] is True and summary["draining"] is False
    assert set(summary["platforms"]) == {"telegram", "webhook"}
    assert summary["platforms"]["telegram"]["state"] != "connected"
    assert summary["runs"] == {"running": 0, "queued": 0}
    assert summary["cron"] == {"active": 0, "due": 0, "next_at": None}
    assert summary["outbox"] == {"pending": 0, "in_doubt": 0}
    assert summary["uptime_seconds"] >= 0 and summary["version"]
    assert summary["tool_sandbox"]["level"] in ("bwrap", "unshare", "none", "unavailable")


async def _wait_telegram_error(running: dict[str, Any]) -> None:
    async def poll() -> None:
        while True:
            async with running["http"].get(f"{running['gateway'].url}/readyz") as r:
                if (await r.json())["platforms"]["telegram"]["last_error"]:
                    return
            await asyncio.sleep(0.05)
    await asyncio.wait_for(poll(), 15)


async def test_status_with_a_wrong_token_names_http_api_token(running: dict[str, Any], tmp_path: Path) -> None:
    gateway, home = running["gateway"], running["home"]
    wrong = _config(tmp_path / "wrong.yaml", home, "http://127.0.0.1:1/v1", port=gateway.port, token="not-it",
                    telegram_port=1)
    code, out, err = await _cli("status", "--config", str(wrong), home=home)
    assert code == 1 and out == ""
    assert err.strip() == (f"error: {gateway.url}/api/status refused the token (401): http.api_token in the config "
                           "differs from the running gateway's")
    async with running["http"].get(f"{gateway.url}/api/status") as r:
        assert r.status == 401 and "http.api_token" in (await r.json())["error"]


async def test_status_when_nothing_listens_names_the_url(tmp_path: Path) -> None:
    port = _free_port()
    config = _config(tmp_path / "config.yaml", tmp_path, "http://127.0.0.1:1/v1", port=port, token=TOKEN,
                     telegram_port=1)
    code, out, err = await _cli("status", "--config", str(config), home=tmp_path)
    assert code == 1 and out == ""
    assert err.startswith(f"error: no gateway answered at http://127.0.0.1:{port} (")
    assert "is it running?" in err and len(err.strip().splitlines()) == 1
    code, _out, err = await _cli("status", "--url", f"http://127.0.0.1:{port}/", "--config", str(config),
                                 home=tmp_path)
    assert code == 1 and f"http://127.0.0.1:{port} " in err


async def test_readyz_turns_unready_while_draining(make_gateway: Any) -> None:
    h = await make_gateway(responder=lambda _request: text("slow", latency=1.0))
    await h.chat.user_says("take your time")
    await h.model.wait_for_requests(1)
    stopping = asyncio.create_task(h.gateway.stop(drain_timeout=3))
    await asyncio.sleep(0.1)
    async with h.http.get(f"{h.base_url}/readyz") as r:
        body = await r.json()
        assert r.status == 503 and body["ready"] is False and body["draining"] is True and body["store"] == "ok"
    await stopping
    assert h.chat.final_texts() == ["slow"]  # the run in flight still finished


async def test_api_status_needs_the_token(make_gateway: Any) -> None:
    h = await make_gateway()
    async with h.http.get(f"{h.base_url}/api/status", headers={"Authorization": "Bearer test-api-token"}) as r:
        summary = await r.json()
    assert r.status == 200 and summary["ready"] is True
    assert set(summary["platforms"]) == {"telegram", "webhook", "callback"}
    assert summary["runs"] == {"running": 0, "queued": 0} and summary["outbox"] == {"pending": 0, "in_doubt": 0}
    async with h.http.get(f"{h.base_url}/api/status") as r:
        assert r.status == 401
    async with h.http.get(f"{h.base_url}/api/status", headers={"Authorization": "Bearer wrong"}) as r:
        assert r.status == 401


NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def _job(next_fire_at: datetime, state: str = "active") -> CronJob:
    schedule = parse_schedule("every 1h", resolve_timezone("UTC"), NOW)
    return CronJob(id="", owner="telegram:1", prompt="p", schedule=schedule, timezone="UTC",
                   origin_platform="telegram", origin_chat_id="100", state=state, next_fire_at=next_fire_at)


async def test_work_counts(store_url: str) -> None:
    """Each count on both databases: runs by state, cron jobs due and next (paused ones ignored), outbox parts
    pending and in doubt (sent ones ignored)."""
    store = await Store.open(store_url)
    try:
        now = NOW.timestamp()
        assert await work_counts(store, now) == WorkCounts(0, 0, 0, 0, None, 0, 0)
        inbox = [(await store.accept(f"t:{i}", "telegram", "chat", f"s{i}", {},
                                     NewRun(f"r{i}", "chat", "telegram", [], "hi"))).inbox_id for i in range(4)]
        await store.start_run("r1", inbox[1])
        await store.start_run("r2", inbox[2])
        await store.finish_run(RunCompletion("r2", inbox[2], "completed", result="ok"))
        jobs = CronStore(store)
        await jobs.create(_job(NOW - timedelta(minutes=1)))
        await jobs.create(_job(NOW - timedelta(minutes=5)))
        await jobs.create(_job(NOW + timedelta(minutes=30)))
        await jobs.create(_job(NOW + timedelta(minutes=10), state="paused"))
        await jobs.create(_job(NOW + timedelta(minutes=90)))
        rows = await store.enqueue([OutboxPart(f"o:{i}", "telegram", str(i), "x") for i in range(4)])
        assert rows is not None
        await store.mark_sent(rows[0].id, "m1")
        assert await store.claim_outbox(rows[1].id, "dead-sender", 60) is not None
        await store.abandon_claims("this-sender")
        assert (await store.claim_outbox(rows[1].id, "this-sender", 60)).in_doubt == 1  # type: ignore[union-attr]
        counts = await work_counts(store, now)
        assert counts == WorkCounts(runs_running=1, runs_queued=2, cron_active=4, cron_due=2,
                                    cron_next_at=(NOW + timedelta(minutes=30)).timestamp(), outbox_pending=3,
                                    outbox_in_doubt=1)
    finally:
        await store.close()
