"""The GitLab REST simulator: notes on issues and merge requests, PRIVATE-TOKEN check, pagination, a held 201."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.sim.gitlab_api import GitLabAPISimulator

TOKEN = "glpat-test-token"
AUTH = {"PRIVATE-TOKEN": TOKEN}


@pytest.fixture
async def gitlab() -> AsyncIterator[GitLabAPISimulator]:
    sim = GitLabAPISimulator(TOKEN)
    await sim.start()
    yield sim
    await sim.stop()


async def test_issue_and_merge_request_notes_are_separate_threads(gitlab: GitLabAPISimulator) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gitlab.api_url}/projects/42/merge_requests/3/notes", json={"body": "on the MR"},
                             headers=AUTH) as r:
            assert r.status == 201
            note = await r.json()
        async with http.get(f"{gitlab.api_url}/projects/42/issues/3/notes", headers=AUTH) as r:
            assert await r.json() == []
        async with http.get(f"{gitlab.api_url}/projects/42/merge_requests/3/notes", headers=AUTH) as r:
            assert await r.json() == [note]
    assert (note["noteable_type"], note["noteable_iid"], note["body"]) == ("MergeRequest", 3, "on the MR")
    assert gitlab.comments("42!3") == [note] and gitlab.comments("42#3") == []


async def test_wrong_token_is_refused_and_nothing_stored(gitlab: GitLabAPISimulator) -> None:
    url = f"{gitlab.api_url}/projects/42/issues/1/notes"
    async with aiohttp.ClientSession() as http, http.post(url, json={"body": "x"},
                                                          headers={"PRIVATE-TOKEN": "wrong"}) as r:
        assert r.status == 401
    assert gitlab.comments("42#1") == [] and gitlab.unauthorized == 1


async def test_pagination_follows_link_headers(gitlab: GitLabAPISimulator) -> None:
    for i in range(45):
        gitlab.add_comment("42#1", f"n{i}")
    seen: list[str] = []
    url: str | None = f"{gitlab.api_url}/projects/42/issues/1/notes"  # GitLab's default page is 20
    pages = 0
    async with aiohttp.ClientSession() as http:
        while url:
            async with http.get(url, headers=AUTH) as r:
                seen += [n["body"] for n in await r.json()]
                url = r.links.get("next", {}).get("url")  # type: ignore[assignment]
            pages += 1
    assert seen == [f"n{i}" for i in range(45)] and pages == 3


async def test_held_post_has_its_201_but_no_end_until_released(gitlab: GitLabAPISimulator) -> None:
    gitlab.hold_next_post()
    url = f"{gitlab.api_url}/projects/42/issues/1/notes"
    async with aiohttp.ClientSession() as http, http.post(url, json={"body": "held"}, headers=AUTH) as r:
        assert r.status == 201
        await asyncio.wait_for(gitlab.holding.wait(), 5)
        reading = asyncio.ensure_future(r.json())
        await asyncio.sleep(0.2)
        assert not reading.done() and len(gitlab.comments("42#1")) == 1
        gitlab.release()
        assert (await asyncio.wait_for(reading, 5))["body"] == "held"
