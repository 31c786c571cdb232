"""The session_search tool against the gateway's real backend, on SQLite and PostgreSQL: only the caller's own
conversations, one query language on both databases, paging, dates, titles, links, and clear errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from tests.conftest import API_TOKEN, WEBHOOK_SECRET, GatewayFactory, Harness
from tools.registry import ISOLATION_PROCESS, registry
from tools.session_search_tool import MAX_QUERY_CHARS, set_session_search_backend

ALICE, BOB = ("1001", "100"), ("1002", "200")  # (user id, DM chat id)


async def _search(user: str, **args: Any) -> dict[str, Any]:
    """The tool as a run of ``user`` calls it (handlers run in worker threads; the backend uses the gateway loop)."""
    ctx = {"user_key": f"telegram:{user}", "platform": "telegram", "run_id": "run-x", "session_key": "s"}
    return json.loads(await asyncio.to_thread(registry.dispatch, "session_search", args, **ctx))


async def _say(h: Harness, text: str, who: tuple[str, str] = ALICE, **where: Any) -> str:
    """``who`` writes ``text`` (in their DM unless ``where`` says otherwise) and the echo comes back; the run id."""
    accepted = await h.chat.user_says(text, user_id=who[0], **{"chat_id": who[1], **where})
    assert (await h.wait_run(accepted.run_id))["status"] == "completed"
    return str(accepted.run_id)


def _places(found: dict[str, Any]) -> list[tuple[str, str]]:
    return [(hit["session"], hit["role"]) for hit in found["results"]]


async def _gateway(make_gateway: GatewayFactory, store_url: str, extra: dict[str, Any] | None = None) -> Harness:
    return await make_gateway({"store": {"url": store_url}, **(extra or {})})


@pytest.fixture
def no_backend() -> Iterator[None]:
    set_session_search_backend(None)
    yield
    set_session_search_backend(None)


def test_registered_in_process_and_unavailable_without_a_store(no_backend: None) -> None:
    entry = registry.get("session_search")
    assert entry is not None and (entry.toolset, entry.isolation, entry.effects) == (
        "session_search", ISOLATION_PROCESS, frozenset())
    assert entry.emoji and entry.check_fn is not None
    assert not registry.is_available("session_search")
    result = json.loads(registry.dispatch("session_search", {"query": "x"}, user_key="telegram:1"))
    assert "unavailable" in result["error"]


async def test_only_the_callers_own_conversations_are_searched(store_url: str, make_gateway: GatewayFactory) -> None:
    h = await _gateway(make_gateway, store_url)
    await _say(h, "my pelican is called Ada")
    await _say(h, "my pelican is called Bea", BOB)
    await _say(h, "pelican in the group", chat_id="-300", chat_type="group")  # Alice's own session of the group
    assert registry.is_available("session_search")
    mine = await _search(ALICE[0], query="pelican")
    assert sorted(_places(mine)) == sorted([("telegram:dm:100", "user"), ("telegram:dm:100", "assistant"),
                                            ("telegram:group:-300:1001", "user"),
                                            ("telegram:group:-300:1001", "assistant")])
    assert "Bea" not in json.dumps(mine)
    theirs = await _search(BOB[0], query="pelican")
    assert {hit["session"] for hit in theirs["results"]} == {"telegram:dm:200"}
    assert "Ada" not in json.dumps(theirs) and "group" not in json.dumps(theirs)
    assert (await _search("1003", query="pelican")) == {"query": "pelican", "count": 0, "next_offset": None,
                                                        "results": []}


async def test_a_group_session_shared_by_its_members_is_nobodys_own(store_url: str,
                                                                     make_gateway: GatewayFactory) -> None:
    h = await _gateway(make_gateway, store_url, {"gateway": {"group_sessions_per_user": False}})
    await _say(h, "group pelican from Alice", chat_id="-300", chat_type="group")
    await _say(h, "group pelican from Bob", BOB, chat_id="-300", chat_type="group")
    await _say(h, "pelican alone with me")
    for user in (ALICE[0], BOB[0]):
        found = await _search(user, query="pelican")
        assert all(hit["session"].startswith("telegram:dm:") for hit in found["results"]), found
    assert (await _search(ALICE[0], query="pelican"))["count"] == 2  # her DM: her message and the echo


async def test_the_query_language_is_the_same_on_both_databases(store_url: str,
                                                                  make_gateway: GatewayFactory) -> None:
    h = await _gateway(make_gateway, store_url)
    said = {await _say(h, text): text
            for text in ("The red Kite flew", "a red balloon and a kite", "green kite", "Kite-surfing in May")}

    async def users_lines(query: str) -> set[str]:
        found = await _search(ALICE[0], query=query, limit=20)
        return {said[hit["run_id"]] for hit in found["results"] if hit["role"] == "user"}

    assert await users_lines("KITE red") == {"The red Kite flew", "a red balloon and a kite"}
    assert await users_lines('"red kite"') == {"The red Kite flew"}
    assert await users_lines("balloon OR green") == {"a red balloon and a kite", "green kite"}
    assert await users_lines("kite -red") == {"green kite", "Kite-surfing in May"}
    assert await users_lines("red balloon OR green -balloon") == {"green kite"}  # AND binds tighter than OR
    assert await users_lines("surfing") == {"Kite-surfing in May"}
    assert await users_lines('kite "unclosed quote') == set()
    found = await _search(ALICE[0], query="flew")
    assert "«flew»" in found["results"][0]["snippet"] or "«Flew»" in found["results"][0]["snippet"]


@pytest.mark.parametrize(("args", "fragment"), [
    ({"query": "-pelican"}, "no word to look for"),
    ({"query": "!!! ???"}, "no word to look for"),
    ({"query": " ".join(f"w{i}" for i in range(17))}, "more than 16 words"),
    ({"query": "x" * (MAX_QUERY_CHARS + 1)}, f"the limit is {MAX_QUERY_CHARS}"),
    ({}, "needs 'query'"),
    ({"query": "x", "limit": 0}, "'limit' must be an integer from 1 to 20"),
    ({"query": "x", "limit": "many"}, "'limit' must be an integer"),
    ({"query": "x", "offset": -1}, "'offset' must be an integer from 0"),
    ({"query": "x", "sort": "best"}, "Unknown sort 'best'"),
])
async def test_bad_queries_and_arguments_are_clear_errors(make_gateway: GatewayFactory, args: dict[str, Any],
                                                          fragment: str) -> None:
    await make_gateway()
    result = await _search(ALICE[0], **args)
    assert fragment in result["error"], result


async def test_pages_go_through_every_match_once(store_url: str, make_gateway: GatewayFactory) -> None:
    h = await _gateway(make_gateway, store_url)
    for i in range(4):
        await _say(h, f"otter number {i}")  # and 4 echoes: 8 matches
    seen: list[tuple[str, str]] = []
    offset: int | None = 0
    while offset is not None:
        page = await _search(ALICE[0], query="otter", limit=3, offset=offset)
        assert page["count"] == len(page["results"]) <= 3
        seen += [(hit["role"], hit["run_id"]) for hit in page["results"]]
        offset = page["next_offset"]
    assert len(seen) == len(set(seen)) == 8
    newest = await _search(ALICE[0], query="otter", sort="newest", limit=2)
    assert [hit["snippet"] for hit in newest["results"]] == ["Echo: «otter» number 3", "«otter» number 3"]


async def test_hits_carry_their_date_conversation_title_and_run(make_gateway: GatewayFactory) -> None:
    h = await make_gateway({"http": {"dashboard": {"enabled": True}}})
    await _say(h, "first chat about the heron")
    await h.chat.user_says("/new", chat_id="100", user_id="1001")
    await h.chat.user_says("/title Bird notes", chat_id="100", user_id="1001")
    await h.chat.wait_for(lambda: any("Bird notes" in t for t in h.chat.final_texts("100")))
    run_id = await _say(h, "second chat about the heron")
    found = await _search(ALICE[0], query="second heron")
    (user_hit,) = [hit for hit in found["results"] if hit["role"] == "user"]
    assert user_hit["session"] == "telegram:dm:100" and user_hit["conversation"] == 1
    assert user_hit["title"] == "Bird notes"
    assert (user_hit["run_id"], user_hit["link"]) == (run_id, f"/dashboard/runs/{run_id}")
    said = datetime.fromisoformat(user_hit["at"].replace("Z", "+00:00"))
    assert user_hit["at"].endswith("Z") and abs((datetime.now(UTC) - said).total_seconds()) < 120
    first = await _search(ALICE[0], query="first heron")
    assert {(hit["conversation"], hit["title"]) for hit in first["results"]} == {(0, None)}  # the title is the 2nd's
    # The link is the dashboard's page of that run.
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.post(f"{h.base_url}/dashboard/login", data={"token": API_TOKEN}) as login:
            assert login.status == 200
        async with browser.get(f"{h.base_url}{user_hit['link']}", allow_redirects=False) as page:
            assert page.status == 200 and "second chat about the heron" in await page.text()


async def test_secrets_in_a_conversation_do_not_come_back(store_url: str, make_gateway: GatewayFactory) -> None:
    h = await _gateway(make_gateway, store_url)
    await _say(h, f"the flamingo password is {WEBHOOK_SECRET} ok")
    found = await _search(ALICE[0], query="flamingo")
    assert found["count"] == 2 and WEBHOOK_SECRET not in json.dumps(found)
    assert all("[REDACTED]" in hit["snippet"] for hit in found["results"])
