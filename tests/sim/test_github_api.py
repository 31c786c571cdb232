"""The GitHub REST simulator: comments created and listed with GitHub's shapes, token check, pagination, a held 201."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.sim.github_api import GitHubAPISimulator

TOKEN = "ghs-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def github() -> AsyncIterator[GitHubAPISimulator]:
    sim = GitHubAPISimulator(TOKEN)
    await sim.start()
    yield sim
    await sim.stop()


async def test_create_then_list(github: GitHubAPISimulator) -> None:
    url = f"{github.base_url}/repos/acme/rocket/issues/7/comments"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json={"body": "hello"}, headers=AUTH) as r:
            assert r.status == 201
            created = await r.json()
        async with http.get(url, headers=AUTH) as r:
            listed = await r.json()
    assert created["body"] == "hello" and created["html_url"].endswith(f"#issuecomment-{created['id']}")
    assert listed == [created] == github.comments("acme/rocket#7")


async def test_wrong_token_is_refused_and_nothing_stored(github: GitHubAPISimulator) -> None:
    url = f"{github.base_url}/repos/acme/rocket/issues/7/comments"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json={"body": "x"}, headers={"Authorization": "Bearer nope"}) as r:
            assert (r.status, (await r.json())["message"]) == (401, "Bad credentials")
        async with http.get(url) as r:
            assert r.status == 401
    assert github.comments("acme/rocket#7") == [] and github.unauthorized == 2


async def test_pagination_follows_link_headers(github: GitHubAPISimulator) -> None:
    for i in range(5):
        github.add_comment("acme/rocket#7", f"c{i}")
    seen: list[str] = []
    url: str | None = f"{github.base_url}/repos/acme/rocket/issues/7/comments?per_page=2"
    async with aiohttp.ClientSession() as http:
        while url:
            async with http.get(url, headers=AUTH) as r:
                seen += [c["body"] for c in await r.json()]
                url = r.links.get("next", {}).get("url")  # type: ignore[assignment]
    assert seen == [f"c{i}" for i in range(5)]


async def test_held_post_has_its_201_but_no_end_until_released(github: GitHubAPISimulator) -> None:
    github.hold_next_post()
    url = f"{github.base_url}/repos/acme/rocket/issues/7/comments"
    async with aiohttp.ClientSession() as http, http.post(url, json={"body": "held"}, headers=AUTH) as r:
        assert r.status == 201
        await asyncio.wait_for(github.holding.wait(), 5)
        reading = asyncio.ensure_future(r.json())
        await asyncio.sleep(0.2)
        assert not reading.done() and len(github.comments("acme/rocket#7")) == 1
        github.release()
        assert (await asyncio.wait_for(reading, 5))["body"] == "held"
