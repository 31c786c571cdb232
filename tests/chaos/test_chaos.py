"""SIGKILL chaos: the gateway is killed at random moments under steady traffic on every platform and restarted;
in the end every input has exactly one completed run and every answer was delivered exactly once, in order. Some
chat messages carry a photo or a document (fetched by the run), some ask for a file the answer sends (sent after its
text like any part: exactly once, on Telegram at least once).

`make chaos` runs the long version (``--chaos-kills 200``); ``--chaos-seed`` replays a schedule's choices
(the timing of a loaded machine still varies).
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import closing
from pathlib import Path

import aiohttp
import pytest

from gateway.sim.callback_sink import CallbackSink
from gateway.sim.discord_api import DiscordSimulator
from gateway.sim.model_server import ScriptedModel
from gateway.sim.slack_api import SlackSimulator
from gateway.sim.telegram_api import TelegramSimulator
from tests.chaos.checks import db_progress, delivered, figures, read_db, verify
from tests.chaos.driver import CHATS, PLATFORMS, Driver, Input
from tests.chaos.world import AckModel, World, reply_for
from tests.gateway_process import GatewayProcess

TRIGGER_TIMEOUT = 20.0  # a trigger that waits longer kills anyway (and is counted)
_TELEGRAM_UPLOADS = ("sendPhoto", "sendDocument")
_SLACK_UPLOAD = "files.completeUploadExternal"  # shares the uploaded file in the chat
QUIET_FOR = 5.0  # the final wait ends early once nothing has moved for this long


@pytest.fixture
async def world(tmp_path: Path, chaos_seed: int) -> AsyncIterator[World]:
    """Every simulator on an ephemeral port in this process, and the gateway's config pointing at them."""
    acks = AckModel(random.Random(f"{chaos_seed}:model"))
    sims = (TelegramSimulator(), SlackSimulator(), DiscordSimulator(), ScriptedModel(acks), CallbackSink())
    for sim in sims:
        await sim.start()
    telegram, slack, discord, model, sink = sims
    discord.replay_overlap = 3  # a RESUME replays a few events the client already had, as Discord may
    w = World(tmp_path, telegram, slack, discord, model, acks, sink, aiohttp.ClientSession())
    w.write_config()
    try:
        yield w
    finally:
        await w.stop()


async def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``predicate`` (it reads other processes' state: files, a database) until it holds."""
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}") from None


class Chaos:
    """Kills the gateway at random moments chosen where work is in flight."""

    def __init__(self, world: World, driver: Driver, rng: random.Random) -> None:
        self.world = world
        self.driver = driver
        self.rng = rng
        self.modes: Counter[str] = Counter()
        self.timeouts: Counter[str] = Counter()
        self._triggers: dict[str, Callable[[GatewayProcess], Awaitable[None]]] = {
            "burst": self._burst, "slow-model": self._slow_model, "mid-send": self._mid_send,
            "mid-upload": self._mid_upload, "startup": self._startup}

    async def kill_once(self, gateway: GatewayProcess) -> None:
        """Wait for a randomly chosen moment, then SIGKILL."""
        mode = self.rng.choices(list(self._triggers), weights=(3, 2, 2, 1, 2))[0]
        self.modes[mode] += 1
        try:
            async with asyncio.timeout(TRIGGER_TIMEOUT):
                await self._triggers[mode](gateway)
        except TimeoutError:
            self.timeouts[mode] += 1
        await gateway.kill()
        self.world.mark(f"gateway {self.world.processes.index(gateway) + 1} was killed ({mode})")
        self.world.discord.expire_detached_sessions()  # the dead process never RESUMEs its session

    async def _ready(self, gateway: GatewayProcess) -> None:
        await gateway.wait_ready(self.world.http, timeout=TRIGGER_TIMEOUT)

    async def _burst(self, gateway: GatewayProcess) -> None:
        """Right after a burst of messages: they are being accepted and run."""
        await self._ready(gateway)
        await self.driver.burst(self.rng.randint(5, 15))
        await asyncio.sleep(self.rng.uniform(0, 0.25))

    async def _slow_model(self, gateway: GatewayProcess) -> None:
        """While the model takes its time: runs are in flight."""
        await self._ready(gateway)
        self.world.acks.slow(self.rng.randint(3, 10), 0.2, 1.0)
        seen = self.world.model.request_count
        await self.driver.burst(3)
        await self.world.model.wait_for_requests(seen + 1, timeout=TRIGGER_TIMEOUT)
        await asyncio.sleep(self.rng.uniform(0, 0.5))

    async def _mid_send(self, gateway: GatewayProcess) -> None:
        """The moment a platform took an answer (or a file): before the gateway may have recorded it as sent."""
        await self._ready(gateway)
        w, platform = self.world, self.rng.choice(PLATFORMS)
        sends: Callable[[], int] = {
            "telegram": lambda: sum(len(w.telegram.calls_of(m)) for m in ("sendMessage", *_TELEGRAM_UPLOADS)),
            "slack": lambda: len(w.slack.calls_of("chat.postMessage")) + len(w.slack.calls_of(_SLACK_UPLOAD)),
            "discord": lambda: len(w.discord.calls_of("create_message")),
            "webhook": lambda: len(w.sink.received),
        }[platform]
        before = sends()
        await self.driver.burst(3, platform)
        # the simulators wake their waiters the moment a call is applied, so the kill follows within a loop turn
        if platform == "webhook":
            await w.sink.wait_for(before + 1, timeout=TRIGGER_TIMEOUT)
        else:
            sim = {"telegram": w.telegram, "slack": w.slack, "discord": w.discord}[platform]
            await sim.wait_for(lambda: sends() > before, timeout=TRIGGER_TIMEOUT)

    async def _mid_upload(self, gateway: GatewayProcess) -> None:
        """The moment a platform took a file an answer sends: before the gateway may have recorded it as sent."""
        await self._ready(gateway)
        w, platform = self.world, self.rng.choice(CHATS)
        uploads: Callable[[], int] = {
            "telegram": lambda: sum(len(w.telegram.calls_of(m)) for m in _TELEGRAM_UPLOADS),
            "slack": lambda: len(w.slack.calls_of(_SLACK_UPLOAD)),
            "discord": lambda: sum(bool(c.files) for c in w.discord.calls_of("create_message")),
        }[platform]
        before = uploads()
        await self.driver.burst(2, platform, wants_file=True)
        sim = {"telegram": w.telegram, "slack": w.slack, "discord": w.discord}[platform]
        await sim.wait_for(lambda: uploads() > before, timeout=TRIGGER_TIMEOUT)

    async def _startup(self, gateway: GatewayProcess) -> None:
        """Soon after the startup line: backlogs are being taken in, unfinished runs resumed, Discord backfilled."""
        await asyncio.sleep(self.rng.uniform(0, 0.6))


async def wait_idle(world: World, driver: Driver, timeout: float) -> str:
    """Wait until the gateway took every input and finished all its work; returns what is still outstanding."""
    keys = {i.dedupe_key for i in driver.inputs}
    loop = asyncio.get_running_loop()
    deadline, last, last_change = loop.time() + timeout, None, loop.time()
    while True:
        inbox, busy, pending, sent = await asyncio.to_thread(db_progress, world.db_path)
        unconfirmed = len(world.telegram.pending_updates)
        unacked = sum(not d.acked for d in world.slack.deliveries)
        outstanding = (f"{len(keys - inbox)} inputs not in the inbox, {busy} inbox rows unfinished, {pending} "
                       f"outbox parts unsent, {unconfirmed} telegram updates unconfirmed, {unacked} slack events "
                       f"unacked")
        if not (keys - inbox or busy or pending or unconfirmed or unacked):
            return ""
        state = (len(inbox), busy, pending, sent, unconfirmed, unacked)
        if state != last:
            last, last_change = state, loop.time()
        if loop.time() - last_change > QUIET_FOR:
            return outstanding  # nothing moves any more: what is missing will not come
        if loop.time() > deadline:
            return outstanding
        await asyncio.sleep(0.1)


async def test_sigkill_at_random_moments_loses_nothing_and_answers_once(
        world: World, chaos_seed: int, chaos_kills: int, chaos_report: list[str]) -> None:
    seed, kills, report = chaos_seed, chaos_kills, chaos_report
    report.append(f"seed {seed}, {kills} kills (replay: pytest tests/chaos --chaos-seed {seed} --chaos-kills {kills})")
    rng = random.Random(seed)
    driver = Driver(world, random.Random(f"{seed}:driver"))
    chaos = Chaos(world, driver, rng)
    started = time.monotonic()

    # warm-up: the gateway answers once on every platform and starts following each Discord chat
    gateway = await world.start_gateway()
    await gateway.wait_ready(world.http)
    warm = await driver.warm_up()
    await wait_until(lambda: _answered(world, warm), 30, "the warm-up answers")
    channels = {i.reply_chat for i in warm if i.platform == "discord"}
    await wait_until(lambda: channels <= _followed(world.db_path), 10,
                     "the Discord adapter to save its backfill cursors")

    stop = asyncio.Event()
    traffic = asyncio.create_task(driver.run(stop))
    try:
        for n in range(kills):
            await chaos.kill_once(gateway)
            if n == kills - 1:
                stop.set()
                await traffic
            await asyncio.sleep(rng.uniform(0, 0.3))  # downtime: traffic piles up at the platforms
            gateway = await world.start_gateway()
    finally:
        stop.set()
        await traffic

    chaos_done = time.monotonic()
    unaccepted = await driver.settle(timeout=60)
    outstanding = await wait_idle(world, driver, timeout=90)
    exit_code = await gateway.terminate()
    drained = time.monotonic()

    db = await asyncio.to_thread(read_db, world.db_path)
    replies = delivered(world)
    verdict = verify(driver.inputs, db, replies, driver.problems, world.when, world.acks.media_seen)
    for inp in unaccepted:
        verdict.add("webhooks never acknowledged", f"{inp.token} ({inp.dedupe_key})")
    if exit_code != 0:
        verdict.add("the final gateway did not stop cleanly", f"exit code {exit_code}; log {gateway.stderr_path}")
    killed = world.processes[:-1]
    for process in killed:
        for pid in process.lingering:
            verdict.add("agent workers outliving their killed gateway", f"pid {pid} ({process.stderr_path})")
    if not any(process.workers_seen == 2 for process in killed):
        verdict.add("agent workers", "no killed gateway had its two agent worker processes")
    modes = ", ".join(f"{m} {n}" for m, n in sorted(chaos.modes.items()))
    timeouts = sum(chaos.timeouts.values())
    workers = sum(process.workers_seen for process in killed)
    report += [f"kills {kills} ({modes}), restarts {kills}, trigger waits that timed out {timeouts}; "
               f"{workers} agent worker processes killed with their gateway, none left running; "
               f"{chaos_done - started:.1f} s of chaos, {drained - chaos_done:.1f} s to drain and stop",
               *figures(world, driver, db, replies, verdict)]
    if outstanding:
        report.append(f"still outstanding when the gateway went quiet: {outstanding}")
    assert not verdict.offenders, verdict.failure_message(world.home)


def _answered(world: World, inputs: list[Input]) -> bool:
    shown = {r.text for r in delivered(world)}
    return all(reply_for(i.token) in shown for i in inputs)


def _followed(database: Path) -> set[str]:
    """Channels the Discord adapter's saved backfill cursors follow (kept in the gateway's store)."""
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)) as db:
            row = db.execute("SELECT value FROM platform_state WHERE key = 'discord:backfill-cursors'").fetchone()
    except sqlite3.OperationalError:  # not created yet
        return set()
    return set(json.loads(row[0])["channels"]) if row else set()
