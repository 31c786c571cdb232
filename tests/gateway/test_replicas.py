"""Three `hermes-gateway run` processes on one PostgreSQL database: nothing processed twice, sessions
in order across replicas, cron fires once, and the cron leader's SIGKILL loses and repeats nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
import yaml

from gateway.cron_store import CronStore
from gateway.schema import inbox_t, runs_t
from gateway.sim.callback_sink import CallbackSink
from gateway.sim.model_server import ScriptedModel, rules, text
from gateway.sim.telegram_api import TelegramSimulator
from gateway.store import Store
from platforms.webhook_signatures import sign
from tests.gateway_process import GatewayProcess
from tools.cronjob_tools import CronJob, Schedule

SECRET = "replicas-webhook-secret-0123"
HOOK_SECRET = "replicas_telegram-hook-secret"
ALICE = 1001

pytestmark = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)


@dataclass
class Cluster:
    """Simulators and gateway replicas sharing one database."""

    home: Path
    store: Store
    model: ScriptedModel
    sink: CallbackSink
    telegram: TelegramSimulator
    http: aiohttp.ClientSession
    config: Path
    replicas: list[GatewayProcess] = field(default_factory=list)

    def use_telegram_polling(self) -> None:
        """Receive Telegram by long polling (only the leader may poll) instead of the webhook."""
        data = yaml.safe_load(self.config.read_text(encoding="utf-8"))
        telegram = data["platforms"]["telegram"]
        for key in ("mode", "webhook_url", "webhook_secret"):
            telegram.pop(key)
        telegram["poll_timeout"] = 1
        self.config.write_text(yaml.safe_dump(data), encoding="utf-8")

    async def start(self, n: int = 1) -> list[GatewayProcess]:
        started = [GatewayProcess(self.config, self.home) for _ in range(n)]
        await asyncio.gather(*(p.start() for p in started))
        await asyncio.gather(*(p.wait_ready(self.http) for p in started))
        self.replicas += started
        return started

    async def post_webhook(self, replica: GatewayProcess, delivery_id: str, n: int) -> int:
        body = json.dumps({"n": n}).encode()
        headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
                   **sign("github", SECRET, body, delivery_id=delivery_id)}
        async with self.http.post(f"{replica.url}/webhooks/ci", data=body, headers=headers) as r:
            return r.status

    async def post_telegram(self, replica: GatewayProcess, update_id: int, text_: str) -> int:
        update = {"update_id": update_id, "message": {
            "message_id": update_id, "date": int(time.time()), "text": text_,
            "chat": {"id": ALICE, "type": "private", "first_name": "Alice"},
            "from": {"id": ALICE, "is_bot": False, "first_name": "Alice"}}}
        async with self.http.post(f"{replica.url}/telegram/webhook", json=update,
                                  headers={"X-Telegram-Bot-Api-Secret-Token": HOOK_SECRET}) as r:
            return r.status

    async def leader(self) -> GatewayProcess:
        async def find() -> GatewayProcess:
            while True:
                for replica in self.replicas:
                    if replica.proc is not None and replica.proc.returncode is None:
                        with contextlib.suppress(aiohttp.ClientError):
                            async with self.http.get(f"{replica.url}/readyz") as r:
                                if (await r.json())["coordination"]["leader"]:
                                    return replica
                await asyncio.sleep(0.05)
        return await asyncio.wait_for(find(), 15)

    async def scalar(self, query: Any) -> Any:
        return await self.store.db.read(lambda conn: conn.execute(query).scalar_one())


async def _eventually(check: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    async def poll() -> None:
        while not await check():
            await asyncio.sleep(0.1)
    await asyncio.wait_for(poll(), timeout)


@pytest.fixture
async def cluster(store_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with ScriptedModel() as model, TelegramSimulator() as telegram, aiohttp.ClientSession() as http:
        sink = CallbackSink()
        await sink.start()
        telegram.add_chat(ALICE, "private", first_name="Alice")
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "model": {"base_url": model.base_url, "api_key": "k", "name": "scripted-model", "max_retries": 0,
                      "stream": False, "timeout": 60},
            "http": {"port": 0},
            "store": {"url": store_url},
            # Each replica runs its agent loops in two worker processes of its own.
            "gateway": {"workspace": str(tmp_path / "workspace"), "drain_timeout": 1,
                        "max_concurrent_webhook_runs": 64, "agent_workers": 2},
            "auth": {"platforms": {"telegram": {"allowed_users": [str(ALICE)]}}},
            "cron": {"sync_interval_seconds": 0.5},
            "logging": {"level": "WARNING"},
            "platforms": {
                "webhook": {"routes": {"ci": {
                    "secret": SECRET, "scheme": "github", "prompt": "Build {payload.n}", "deliver_to": "callback:sink",
                    "rate_limit_per_minute": 100000, "max_concurrency": 64}}},
                "callback": {"targets": {"sink": {"url": sink.url, "secret": "sink-secret-123456"}}},
                "telegram": {"enabled": True, "token": telegram.token, "base_url": telegram.base_url,
                             "base_file_url": telegram.base_file_url, "mode": "webhook",
                             "webhook_url": "http://127.0.0.1:9/telegram/webhook", "webhook_secret": HOOK_SECRET},
            },
        }), encoding="utf-8")
        store = await Store.open(store_url)
        c = Cluster(tmp_path, store, model, sink, telegram, http, config)
        try:
            yield c
        finally:
            for replica in c.replicas:
                if replica.proc is not None and replica.proc.returncode is None:
                    await replica.kill()
            await store.close()
            await sink.stop()


async def test_webhooks_across_three_replicas_run_and_deliver_exactly_once(cluster: Cluster,
                                                                          report: Callable[[str], None]) -> None:
    replicas = await cluster.start(3)
    ids = [str(uuid.uuid4()) for _ in range(1000)]
    statuses: Counter[int] = Counter()
    queue: asyncio.Queue[tuple[int, str, int]] = asyncio.Queue()
    for i, delivery_id in enumerate(ids):
        queue.put_nowait((i % 3, delivery_id, i))
    for i, delivery_id in enumerate(ids[:100]):  # redelivered, to a different replica than the first time
        queue.put_nowait(((i + 1) % 3, delivery_id, i))

    async def sender() -> None:
        while not queue.empty():
            replica, delivery_id, n = queue.get_nowait()
            statuses[await cluster.post_webhook(replicas[replica], delivery_id, n)] += 1

    await asyncio.wait_for(asyncio.gather(*(sender() for _ in range(24))), 120)
    assert statuses[202] == 1000 and statuses[200] == 100, statuses
    await cluster.sink.wait_for(1000, timeout=120)
    await asyncio.sleep(1.0)  # anything delivered twice would show up by now
    received = cluster.sink.received
    texts = Counter(r["text"].split("\n", 1)[0] for r in received)  # the echo of the prompt line
    report(f"3 replicas: 1100 webhooks sent (100 redelivered to another replica) -> "
           f"{await cluster.scalar(sa.select(sa.func.count()).select_from(runs_t))} runs, "
           f"{len(received)} deliveries, {len({r['webhook-id'] for r in received})} distinct")
    assert len(received) == 1000 and len({r["webhook-id"] for r in received}) == 1000
    assert set(texts) == {f"Echo: Build {i}" for i in range(1000)} and set(texts.values()) == {1}
    assert await cluster.scalar(sa.select(sa.func.count()).select_from(runs_t)) == 1000
    assert await cluster.scalar(sa.select(sa.func.count()).select_from(runs_t)
                                .where(runs_t.c.status == "completed")) == 1000


async def test_one_chat_across_two_replicas_runs_in_order_one_at_a_time(cluster: Cluster) -> None:
    first, second = await cluster.start(2)
    cluster.model.responder = rules(
        (r"^slow question", text("first answer", latency=1.5)),
        (r"^quick question", lambda _m, request: text(f"second answer after {len(request['messages'])} messages")))
    assert await cluster.post_telegram(first, 1, "slow question") == 200
    await cluster.model.wait_for_requests(1, timeout=15)
    assert await cluster.post_telegram(second, 2, "quick question") == 200

    async def both_answered() -> bool:
        return len(cluster.telegram.sent_messages(ALICE)) == 2
    await _eventually(both_answered, 30)
    assert [m.text for m in cluster.telegram.sent_messages(ALICE)] == [
        "first answer", "second answer after 4 messages"]  # system, slow q, first answer, quick q
    _first, second_req = cluster.model.requests
    assert [m["content"] for m in second_req["messages"][1:]] == ["slow question", "first answer", "quick question"]
    runs = await cluster.store.list_runs(10)
    slow, quick = sorted(runs, key=lambda r: r.created_at)
    assert quick.started_at >= slow.finished_at, "the second run started only after the first finished"


def _cron_job(prompt: str, every: int, fires: int, start: datetime) -> CronJob:
    return CronJob(id="", owner="telegram:1001", prompt=prompt, schedule=Schedule("interval", seconds=every,
                   start=start), timezone="UTC", origin_platform="telegram", origin_chat_id=str(ALICE),
                   deliver="callback:sink", repeat=fires, next_fire_at=start)


async def _fires(cluster: Cluster, job_id: str) -> list[str]:
    query = sa.select(inbox_t.c.dedupe_key).where(inbox_t.c.dedupe_key.like(f"cron:{job_id}:%"))
    return sorted(await cluster.store.db.read(lambda conn: list(conn.execute(query).scalars())))


async def test_cron_on_three_replicas_fires_each_time_once(cluster: Cluster, report: Callable[[str], None]) -> None:
    await cluster.start(3)
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    job = await CronStore(cluster.store).create(_cron_job("TICK", 1, 10, start))
    await cluster.sink.wait_for(10, timeout=60)
    await asyncio.sleep(1.5)
    expected = [f"cron:{job.id}:{(start + timedelta(seconds=i)).isoformat()}" for i in range(10)]
    assert await _fires(cluster, job.id) == expected
    assert len(cluster.sink.received) == 10 and {r["text"] for r in cluster.sink.received} == {"Echo: TICK"}
    report(f"cron on 3 replicas, 10 fire times -> {len(await _fires(cluster, job.id))} fires, "
           f"{len(cluster.sink.received)} deliveries")


async def test_sigkill_of_the_cron_leader_hands_over_without_losing_or_repeating_a_fire(
        cluster: Cluster, report: Callable[[str], None]) -> None:
    await cluster.start(3)
    cluster.model.latency = 1.0  # a fire is mid-run when its leader dies
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    job = await CronStore(cluster.store).create(_cron_job("TOCK", 3, 6, start))
    await cluster.model.wait_for_requests(2, timeout=30)  # the second fire is running
    leader = await cluster.leader()
    killed_at = time.monotonic()
    await leader.kill()
    successor = await cluster.leader()
    takeover = time.monotonic() - killed_at
    assert successor is not leader
    await cluster.sink.wait_for(6, timeout=60)
    await asyncio.sleep(2.0)
    expected = [f"cron:{job.id}:{(start + timedelta(seconds=3 * i)).isoformat()}" for i in range(6)]
    assert await _fires(cluster, job.id) == expected, "each fire time claimed exactly once"
    run_ids = Counter(r["run_id"] for r in cluster.sink.received)
    assert len(run_ids) == 6 and set(run_ids.values()) == {1}, "each fire delivered exactly once"
    report(f"cron leader SIGKILLed during a fire: new leader after {takeover:.2f} s; "
           f"6 fire times -> {len(await _fires(cluster, job.id))} fires, {len(cluster.sink.received)} deliveries")
    assert takeover < 5.0


async def test_telegram_polling_runs_on_the_leader_only_and_moves_when_it_dies(cluster: Cluster) -> None:
    cluster.use_telegram_polling()
    await cluster.start(3)
    for i in range(5):
        cluster.telegram.user_sends(f"before {i}", user_id=ALICE, chat_id=ALICE)

    async def answered(n: int) -> bool:
        return len(cluster.telegram.sent_messages(ALICE)) >= n
    await _eventually(lambda: answered(5), 30)
    leader = await cluster.leader()
    await leader.kill()
    for i in range(5):
        cluster.telegram.user_sends(f"after {i}", user_id=ALICE, chat_id=ALICE)
    await _eventually(lambda: answered(10), 30)
    await asyncio.sleep(1.5)
    texts = [m.text for m in cluster.telegram.sent_messages(ALICE)]
    assert texts == [f"Echo: before {i}" for i in range(5)] + [f"Echo: after {i}" for i in range(5)]
    conflicts = [c for c in cluster.telegram.calls_of("getUpdates") if c.status == 409]
    assert conflicts == [], "two replicas polled at once"
    assert cluster.telegram.pending_updates == []


async def test_stop_reaches_the_run_on_another_replica(cluster: Cluster) -> None:
    first, second = await cluster.start(2)
    cluster.model.responder = rules((r"^long task", text("too late", latency=30)))
    assert await cluster.post_telegram(first, 1, "long task") == 200
    await cluster.model.wait_for_requests(1, timeout=15)
    assert await cluster.post_telegram(second, 2, "/stop") == 200

    async def answered() -> bool:
        return len(cluster.telegram.sent_messages(ALICE)) >= 1
    await _eventually(answered, 15)
    assert [m.text for m in cluster.telegram.sent_messages(ALICE)] == ["Stopped the current run."]

    async def cancelled() -> bool:
        return [r.status for r in await cluster.store.list_runs(5)] == ["cancelled"]
    await _eventually(cancelled, 10)
