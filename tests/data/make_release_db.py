"""Fill a database the way the previous release (schema v4, commit 3f55c5a) leaves one; the dumps beside this file
were made with it. Run from a checkout of that release: ``PYTHONPATH=<checkout> python make_release_db.py URL``,
then ``sqlite3 FILE .dump`` or ``pg_dump --inserts --no-owner --no-privileges``."""

import asyncio
import sys
import zoneinfo
from datetime import UTC, datetime

from gateway.cron_store import CronStore
from gateway.pairing import PairingStore
from gateway.session_summary import SummaryStore
from gateway.store import (
    ChatMessage,
    NewRun,
    OutboxPart,
    PlatformStateStore,
    RunCompletion,
    SessionRef,
    Store,
    ToolStateStore,
)
from tools.cronjob_tools import CronJob, parse_schedule


async def main(url: str) -> None:
    """A finished chat run with its transcript and its answer still to send, a run still waiting, a memory note,
    a todo list, a conversation summary, adapter state, a pending pairing code and a cron job."""
    store = await Store.open(url)
    key = "telegram:dm:100"
    acc = await store.accept("telegram:u1", "telegram", "chat", key, {"event": {"text": "hello"}},
                             NewRun("run-1", "chat", "telegram", ["hermes-telegram"], "hello", "telegram:100"))
    ctx = await store.start_run("run-1", acc.inbox_id, SessionRef(key, "telegram", "100", "100", None), 50)
    transcript = [ChatMessage("user", "hello"), ChatMessage("assistant", "Hi there!")]
    answer = OutboxPart("run:run-1:0", "telegram", "100", "Hi there!", run_id="run-1")
    await store.finish_run(RunCompletion("run-1", acc.inbox_id, "completed", result="Hi there!", session_key=key,
                                         epoch=ctx.epoch, model_calls=1, ended_by="answer", transcript=transcript,
                                         deliveries=[answer]))
    await store.accept("telegram:u2", "telegram", "chat", key, {"event": {"text": "pending"}},
                       NewRun("run-2", "chat", "telegram", ["hermes-telegram"], "pending", "telegram:100"))
    tools = ToolStateStore(store)
    await tools.add_note("telegram:100", "likes tea")
    await tools.save_todos(key, [{"id": "1", "content": "write tests", "status": "pending"}])
    await SummaryStore(store).save(key, 0, summary="earlier talk", through_id=1)
    await PlatformStateStore(store).save("discord:session", "abc")
    await PairingStore(store, 3600, 10).issue("telegram", "200", "bob", "200")
    now = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    await CronStore(store).create(CronJob(id="", owner="telegram:100", prompt="daily digest",
                                          schedule=parse_schedule("every 1d", zoneinfo.ZoneInfo("UTC"), now),
                                          timezone="UTC", origin_platform="telegram", origin_chat_id="100",
                                          next_fire_at=now))
    await store.close()


asyncio.run(main(sys.argv[1]))
