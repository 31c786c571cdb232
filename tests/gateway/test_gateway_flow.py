"""End-to-end flows through an in-process gateway: webhook runs, chat runs, commands, delivery."""

from __future__ import annotations

import asyncio
import json

from gateway.sim.model_server import rules, text, tool_call
from tests.conftest import RecordingAdapter


async def test_webhook_run_with_tool_call_is_delivered_once(make_gateway) -> None:
    h = await make_gateway(responder=rules((r"UNTRUSTED WEBHOOK PAYLOAD", tool_call("todo", {"action": "list"}))))
    status, body = await h.post_webhook()
    assert status == 202 and body["duplicate"] is False
    run = await h.wait_run(body["run_id"])
    assert run["status"] == "completed"
    assert run["kind"] == "webhook" and run["source"] == "github"
    # todo is not in hermes-webhook: the tool call is refused, and the refusal is what the model saw
    assert run["tool_calls"][0]["name"] == "todo"
    assert "not available in this session" in run["tool_calls"][0]["result"]
    delivered = await h.sink.wait_for(1)
    assert delivered[0]["text"] == run["result"]
    assert delivered[0]["webhook-id"] == f"run:{body['run_id']}:0"
    # the model was told the payload is untrusted, and got only the webhook toolset
    first = h.model.requests[0]
    assert "untrusted data" in first["messages"][0]["content"]
    assert sorted(t["function"]["name"] for t in first.get("tools", [])) == ["web_extract"]


async def test_duplicate_delivery_gets_same_run_and_no_second_run(make_gateway) -> None:
    h = await make_gateway()
    status1, first = await h.post_webhook(delivery_id="dup-1")
    status2, second = await h.post_webhook(delivery_id="dup-1")
    assert (status1, status2) == (202, 200)
    assert second == {"run_id": first["run_id"], "duplicate": True}
    await h.wait_run(first["run_id"])
    await h.sink.wait_for(1)
    await asyncio.sleep(0.2)
    assert len(h.sink.received) == 1
    assert await h.gateway.store.count_runs() == 1
    assert len(h.model.requests) == 1


class _Discord(RecordingAdapter):
    name = "discord"


async def test_the_same_event_id_on_two_platforms_is_two_events(make_gateway) -> None:
    """Platforms number their events independently: the inbox keys them by platform, so one id on two platforms
    is two events (two runs, two answers), while each platform's own redelivery stays a duplicate.

    Fails on the mutant ``return self.event_id`` for ``return f"{self.platform}:{self.event_id}"`` in
    ``MessageEvent.dedupe_key`` (the second platform's message is dropped as a duplicate of the first)."""
    discord = _Discord()
    h = await make_gateway({"auth": {"platforms": {"discord": {"allowed_users": ["1001"]}}}},
                           adapters={"discord": discord})
    first = await h.chat.user_says("from telegram", event_id="1234567890")
    second = await discord.user_says("from discord", event_id="1234567890")
    assert first is not None and second is not None
    assert (first.duplicate, second.duplicate) == (False, False) and first.run_id != second.run_id
    await h.chat.wait_for(lambda: h.chat.final_texts() == ["Echo: from telegram"])
    await discord.wait_for(lambda: discord.final_texts() == ["Echo: from discord"])
    again = await discord.user_says("from discord", event_id="1234567890")
    assert again is not None and (again.duplicate, again.run_id) == (True, second.run_id)
    assert await h.gateway.store.count_inbox() == 2 and len(h.model.requests) == 2


ONE_AT_A_TIME = {"platforms": {"webhook": {"routes": {"github": {"max_concurrency": 1}}}}}


async def test_a_webhook_run_with_a_free_slot_starts_as_it_is_accepted(make_gateway) -> None:
    h = await make_gateway(ONE_AT_A_TIME)
    _, first = await h.post_webhook(delivery_id="a")
    run = await h.gateway.store.get_run(first["run_id"])
    assert run is not None and run.status in ("running", "completed")  # never queued
    assert (run.attempts, run.started_at) == (1, run.created_at)  # started in the accepting transaction
    await h.wait_run(first["run_id"])
    # a redelivery finds the slot free, takes it, learns it is a duplicate: the slot must come back
    assert (await h.post_webhook(delivery_id="a"))[0] == 200
    _, second = await h.post_webhook(delivery_id="b")
    assert (await h.wait_run(second["run_id"], timeout=5))["status"] == "completed"
    await h.sink.wait_for(2)


async def test_a_webhook_run_waiting_for_its_route_slot_is_queued_then_started(make_gateway) -> None:
    h = await make_gateway(ONE_AT_A_TIME)
    h.model.latency = 0.3
    _, first = await h.post_webhook(delivery_id="a")
    _, second = await h.post_webhook(delivery_id="b")
    waiting = await h.gateway.store.get_run(second["run_id"])
    assert waiting is not None and (waiting.status, waiting.attempts, waiting.started_at) == ("queued", 0, None)
    done = await h.wait_run(second["run_id"])
    assert done["status"] == "completed"
    started = await h.gateway.store.get_run(second["run_id"])
    finished_first = await h.gateway.store.get_run(first["run_id"])
    assert started is not None and finished_first is not None and finished_first.finished_at is not None
    assert started.attempts == 1 and started.started_at is not None
    assert started.started_at >= finished_first.finished_at  # one at a time on the route


async def test_chat_round_trip_with_history_and_streamed_preview(make_gateway) -> None:
    h = await make_gateway({"model": {"stream": True}}, responder=rules(
        (r"remember", tool_call("memory", {"action": "add", "text": "likes tea"})),
        (r"what do I like", lambda m, req: text("You like tea. " * 20)),
    ))
    h.model.chunk_size, h.model.chunk_delay = 8, 0.01
    await h.chat.user_says("please remember I like tea")
    await h.chat.wait_for(lambda: any("Done" in t for t in h.chat.final_texts()))
    await h.chat.user_says("what do I like?")
    await h.chat.wait_for(lambda: any(t.startswith("You like tea.") and "▍" not in t
                                      for t in h.chat.final_texts()))
    answer = next(s for s in h.chat.sent if (s.edits or [s.text])[-1].startswith("You like tea"))
    assert answer.edits, "the streamed answer was edited progressively into its final text"
    assert any("▍" in e for e in [answer.text, *answer.edits[:-1]])
    assert answer.edits[-1] == ("You like tea. " * 20)
    # history: the second request carries the first exchange, tool call included
    second_msgs = h.model.requests[-1]["messages"]
    roles = [m["role"] for m in second_msgs]
    assert roles[:1] == ["system"] and "tool" in roles and roles[-1] == "user"
    assert h.chat.typing, "typing indicator sent while running"


async def test_unauthorized_user_never_reaches_model(make_gateway) -> None:
    h = await make_gateway()
    assert await h.chat.user_says("hello", user_id="6666") is None
    await asyncio.sleep(0.1)
    assert h.model.requests == []
    assert h.chat.sent == []
    assert await h.gateway.store.count_inbox() == 0


async def test_commands_new_status_help_and_unknown_goes_to_agent(make_gateway) -> None:
    h = await make_gateway()
    await h.chat.user_says("first message")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    await h.chat.user_says("/status")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 2)
    assert "Model: scripted-model" in h.chat.sent[1].text
    await h.chat.user_says("/new@hermes_bot")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 3)
    assert "new conversation" in h.chat.sent[2].text
    await h.chat.user_says("/frobnicate now")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 4)
    assert h.chat.sent[3].text == "Echo: /frobnicate now"
    # after /new the model no longer sees the first message
    contents = json.dumps(h.model.requests[-1]["messages"])
    assert "first message" not in contents
    assert len(h.model.requests) == 2  # commands never called the model


async def test_outbox_retries_honouring_retry_after(make_gateway) -> None:
    h = await make_gateway()
    h.sink.fail_with = [(429, {"Retry-After": "1"}), (502, {})]
    status, body = await h.post_webhook()
    assert status == 202
    delivered = await h.sink.wait_for(1, timeout=15)
    assert len(delivered) == 1 and len(h.sink.attempts) == 3
    assert h.sink.attempts[1] - h.sink.attempts[0] >= 0.95
    for _ in range(100):
        rows = await h.gateway.store.outbox_rows(body["run_id"])
        if rows[0].status != "pending":
            break
        await asyncio.sleep(0.02)
    assert [r.status for r in rows] == ["sent"] and rows[0].attempts == 3


async def test_healthz_readyz_metrics_and_runs_auth(make_gateway) -> None:
    h = await make_gateway()
    async with h.http.get(f"{h.base_url}/healthz") as r:
        assert r.status == 200
    async with h.http.get(f"{h.base_url}/readyz") as r:
        ready = await r.json()
        assert r.status == 200 and ready["ready"] is True and ready["store"] == "ok"
        assert ready["platforms"]["webhook"]["state"] == "connected"
    _status, body = await h.post_webhook()
    await h.wait_run(body["run_id"])
    assert (await h.post_webhook(secret="wrong-secret"))[0] == 401
    async with h.http.get(f"{h.base_url}/metrics") as r:
        metrics = await r.text()
    assert 'hermes_events_total{outcome="accepted",platform="webhook"} 1.0' in metrics
    assert 'hermes_events_total{outcome="bad_signature",platform="webhook"} 1.0' in metrics
    assert 'hermes_runs_total{kind="webhook",status="completed"} 1.0' in metrics
    assert "hermes_event_loop_lag_seconds" in metrics
    async with h.http.get(f"{h.base_url}/runs/{body['run_id']}") as r:
        assert r.status == 401
    async with h.http.get(f"{h.base_url}/runs/{body['run_id']}", headers={"Authorization": "Bearer wrong"}) as r:
        assert r.status == 401
    async with h.http.get(f"{h.base_url}/runs/nope", headers={"Authorization": "Bearer test-api-token"}) as r:
        assert r.status == 404


async def test_model_failure_gives_short_honest_message(make_gateway) -> None:
    h = await make_gateway()
    h.model.fail_next(1, status=500)
    await h.chat.user_says("hello?")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert h.chat.sent[0].text == "The model service had an internal error. Please try again in a moment."
    runs = await h.gateway.store.list_runs()
    assert runs[0].status == "failed" and "InternalServerError" in runs[0].error


async def test_todo_and_memory_tools_persist_in_the_store(make_gateway) -> None:
    h = await make_gateway(responder=rules(
        (r"plan", tool_call("todo", {"action": "add", "items": ["write tests", "ship"]})),
        (r"note", tool_call("memory", {"action": "add", "text": "prefers short answers"})),
    ))
    await h.chat.user_says("plan the release")
    await h.chat.user_says("note my preference")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 2)
    run_results = [c["result"] for r in await h.gateway.store.list_runs() for c in r.tool_calls]
    assert all('"error"' not in r for r in run_results), run_results
    from gateway.state_stores import ToolStateStore

    state = ToolStateStore(h.gateway.store)
    assert [i["text"] for i in await state.load_todos("telegram:dm:100")] == ["write tests", "ship"]
    assert [n[1] for n in await state.list_notes("telegram:1001")] == ["prefers short answers"]


async def test_a_run_queued_again_after_it_finished_is_not_run_twice(make_gateway) -> None:
    h = await make_gateway()
    status, body = await h.post_webhook(delivery_id="once-1")
    assert status == 202
    first = await h.wait_run(body["run_id"])
    await h.sink.wait_for(1)
    (row,) = [r for r in await h.gateway.store.outbox_rows() if r.run_id == body["run_id"]]
    inbox = await h.gateway.store.get_inbox(1)
    assert inbox is not None and inbox.run_id == body["run_id"]
    await h.gateway.router.executor.execute(h.gateway.router._job(inbox))  # e.g. resumed while it was queued
    await asyncio.sleep(0.2)
    again = await h.get_run(body["run_id"])
    assert (again["status"], again["attempts"], again["result"]) == ("completed", 1, first["result"])
    assert len(h.model.requests) == 1 and len(h.sink.received) == 1
    assert [r.id for r in await h.gateway.store.outbox_rows()] == [row.id]
