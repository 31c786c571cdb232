"""``deliver_to: github|gitlab``: the answer as one comment on the issue or pull request the webhook came from,
exactly once, also when the gateway is killed between the forge's 201 and recording it."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.config import ConfigError, parse_config
from gateway.sim.github_api import GitHubAPISimulator
from gateway.sim.gitlab_api import GitLabAPISimulator
from gateway.sim.model_server import ScriptedModel
from platforms.base import AdapterState
from platforms.forge import ForgeSettings, GitHubAdapter, GitLabAdapter, marker, source_thread
from platforms.webhook_signatures import sign
from tests.conftest import GatewayFactory
from tests.gateway_process import GatewayProcess

GH_TOKEN = "ghs-deliver-token"
GL_TOKEN = "glpat-deliver-token"
SECRET = "deliver-webhook-secret-0123"
PR_EVENT = {"action": "opened", "number": 7, "pull_request": {"number": 7, "title": "Faster countdown"},
            "repository": {"full_name": "acme/rocket"}}


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), timeout)


@pytest.mark.parametrize(("payload", "expected"), [
    (PR_EVENT, "github:acme/rocket#7"),
    ({"action": "created", "issue": {"number": 12, "pull_request": {}}, "comment": {"body": "hi"},
      "repository": {"full_name": "acme/rocket"}}, "github:acme/rocket#12"),
    ({"ref": "refs/heads/main", "pusher": {}, "repository": {"full_name": "acme/rocket"}}, None),
    ({"object_kind": "merge_request", "project": {"id": 42}, "object_attributes": {"iid": 3}}, "gitlab:42!3"),
    ({"object_kind": "issue", "project": {"id": 42}, "object_attributes": {"iid": 5}}, "gitlab:42#5"),
    ({"object_kind": "note", "project": {"id": 42}, "object_attributes": {"id": 99}, "issue": {"iid": 5}},
     "gitlab:42#5"),
    ({"object_kind": "push", "project": {"id": 42}}, None),
])
def test_source_thread_of_payloads(payload: dict[str, Any], expected: str | None) -> None:
    assert source_thread(payload) == expected


def test_deliver_to_github_needs_a_token() -> None:
    route = {"secret": "s", "prompt": "p", "deliver_to": "github"}
    with pytest.raises(ConfigError) as info:
        parse_config({"platforms": {"webhook": {"routes": {"pr": route}}}}, {})
    assert info.value.path == "platforms.github.token"
    cfg = parse_config({"platforms": {"webhook": {"routes": {"pr": route}}, "github": {"token": "t"}}}, {})
    assert cfg.platforms.webhook.routes["pr"].delivery == ("github", "", None)


@pytest.fixture
async def github() -> AsyncIterator[GitHubAPISimulator]:
    sim = GitHubAPISimulator(GH_TOKEN)
    await sim.start()
    yield sim
    await sim.stop()


@pytest.fixture
async def gitlab() -> AsyncIterator[GitLabAPISimulator]:
    sim = GitLabAPISimulator(GL_TOKEN)
    await sim.start()
    yield sim
    await sim.stop()


async def test_pull_request_event_answered_as_one_comment(make_gateway: GatewayFactory,
                                                          github: GitHubAPISimulator) -> None:
    h = await make_gateway({"platforms": {
        "webhook": {"routes": {"pr": {"secret": SECRET, "scheme": "github", "events": ["pull_request"],
                                      "prompt": "Review {payload.pull_request.title}", "deliver_to": "github"}}},
        "github": {"token": GH_TOKEN, "api_base_url": github.base_url}}})
    status, body = await h.post_webhook(PR_EVENT, route="pr", secret=SECRET, event="pull_request")
    assert status == 202
    run = await h.wait_run(body["run_id"])
    [comment] = await github.wait_for_comments("acme/rocket#7", 1)
    assert comment["body"] == f"{run['result']}\n\n{marker('run:' + body['run_id'] + ':0')}"
    assert run["result"].startswith("Echo: Review Faster countdown")
    await asyncio.sleep(0.3)
    assert (github.posts, github.lists) == (1, 0)


async def test_gitlab_merge_request_hook_answered_as_one_note(make_gateway: GatewayFactory,
                                                             gitlab: GitLabAPISimulator) -> None:
    """A GitLab webhook (scheme gitlab) whose answer goes back to its merge request as one note."""
    h = await make_gateway({"platforms": {
        "webhook": {"routes": {"mr": {"secret": SECRET, "scheme": "gitlab", "deliver_to": "gitlab",
                                      "prompt": "Review {payload.object_attributes.title}"}}},
        "gitlab": {"token": GL_TOKEN, "api_base_url": gitlab.api_url}}})
    event = {"object_kind": "merge_request", "project": {"id": 42},
             "object_attributes": {"iid": 3, "title": "Faster countdown"}}
    status, body = await h.post_webhook(event, route="mr", scheme="gitlab", secret=SECRET,
                                        headers={"X-Gitlab-Event": "Merge Request Hook"})
    assert status == 202
    run = await h.wait_run(body["run_id"])
    [note] = await gitlab.wait_for_comments("42!3", 1)
    assert note["body"] == f"{run['result']}\n\n{marker('run:' + body['run_id'] + ':0')}"
    assert run["result"].startswith("Echo: Review Faster countdown")
    assert gitlab.comments("42#3") == []  # the merge request's thread, not an issue's


async def _adapter(adapter: GitHubAdapter | GitLabAdapter) -> GitHubAdapter | GitLabAdapter:
    async def ignore(_: Any) -> None:
        return None
    await adapter.connect(ignore, receive=False)
    assert adapter.state is AdapterState.CONNECTED
    return adapter


async def test_github_part_in_doubt_found_on_a_later_page_is_not_posted_again(github: GitHubAPISimulator) -> None:
    for i in range(150):
        github.add_comment("acme/rocket#7", f"someone else {i}")
    earlier = github.add_comment("acme/rocket#7", f"the answer\n\n{marker('run:r1:0')}")
    adapter = await _adapter(GitHubAdapter(ForgeSettings(GH_TOKEN, github.base_url)))
    try:
        found = await adapter.send("acme/rocket#7", "the answer", metadata={"delivery_id": "run:r1:0",
                                                                              "in_doubt": "1"})
        assert (found.success, found.message_id) == (True, str(earlier["id"]))
        assert (github.posts, github.lists) == (0, 2)
        # in doubt but never posted: looked up, then posted
        posted = await adapter.send("acme/rocket#7", "second", metadata={"delivery_id": "run:r1:1", "in_doubt": "1"})
        assert posted.success and github.posts == 1
        assert github.comments("acme/rocket#7")[-1]["body"] == f"second\n\n{marker('run:r1:1')}"
    finally:
        await adapter.disconnect()


async def test_gitlab_merge_request_note_once_when_in_doubt(gitlab: GitLabAPISimulator) -> None:
    adapter = await _adapter(GitLabAdapter(ForgeSettings(GL_TOKEN, gitlab.api_url)))
    try:
        meta = {"delivery_id": "run:r2:0"}
        first = await adapter.send("42!3", "merge it", metadata=meta)
        again = await adapter.send("42!3", "merge it", metadata={**meta, "in_doubt": "1"})
        assert first.success and again.message_id == first.message_id
        assert [n["body"] for n in gitlab.comments("42!3")] == [f"merge it\n\n{marker('run:r2:0')}"]
        assert gitlab.comments("42#3") == []
    finally:
        await adapter.disconnect()


async def test_refusals_are_not_retried_and_rate_limits_are(github: GitHubAPISimulator) -> None:
    adapter = await _adapter(GitHubAdapter(ForgeSettings("wrong-token", github.base_url)))
    try:
        refused = await adapter.send("acme/rocket#7", "x", metadata={"delivery_id": "run:r3:0"})
        assert (refused.success, refused.retryable) == (False, False) and "401" in (refused.error or "")
        bad = await adapter.send("not a thread", "x")
        assert (bad.success, bad.retryable) == (False, False)
    finally:
        await adapter.disconnect()
    assert github.comments("acme/rocket#7") == []
    adapter = await _adapter(GitHubAdapter(ForgeSettings(GH_TOKEN, github.base_url)))
    try:
        github.rate_limit_next(1, retry_after=7)
        limited = await adapter.send("acme/rocket#7", "x", metadata={"delivery_id": "run:r4:0"})
        assert (limited.success, limited.retryable, limited.retry_after) == (False, True, 7.0)
        assert "429" in (limited.error or "") and github.comments("acme/rocket#7") == []
        again = await adapter.send("acme/rocket#7", "x", metadata={"delivery_id": "run:r4:0"})
        assert again.success and len(github.comments("acme/rocket#7")) == 1
    finally:
        await adapter.disconnect()


# -- the gateway as a process, killed between GitHub's 201 and recording the part as sent ---------------------------


def _write_config(path: Path, home: Path, model_url: str, github_url: str) -> None:
    path.write_text(yaml.safe_dump({
        "model": {"base_url": model_url, "api_key": "k", "name": "scripted-model", "max_retries": 0, "stream": False},
        "http": {"port": 0, "api_token": "deliver-api-token"},
        "store": {"url": f"sqlite:///{home}/state.db"},
        "gateway": {"drain_timeout": 2},
        "platforms": {
            "webhook": {"routes": {"pr": {"secret": SECRET, "scheme": "github", "events": ["pull_request"],
                                          "prompt": "Review {payload.pull_request.title}", "deliver_to": "github"}}},
            "github": {"token": GH_TOKEN, "api_base_url": github_url},
        },
    }))


async def test_sigkill_after_the_201_still_one_comment(tmp_path: Path, github: GitHubAPISimulator) -> None:
    model = ScriptedModel()
    await model.start()
    config = tmp_path / "config.yaml"
    _write_config(config, tmp_path, model.base_url, github.base_url)
    github.hold_next_post()
    first, second = GatewayProcess(config, tmp_path), GatewayProcess(config, tmp_path)
    try:
        async with aiohttp.ClientSession() as http:
            await first.start()
            body = json.dumps(PR_EVENT).encode()
            headers = {"Content-Type": "application/json", "X-GitHub-Event": "pull_request",
                       **sign("github", SECRET, body, delivery_id="pr-7-opened")}
            async with http.post(f"{first.url}/webhooks/pr", data=body, headers=headers) as r:
                assert r.status == 202
                run_id = (await r.json())["run_id"]
            # GitHub stored the comment and sent its 201; the gateway cannot finish reading it: kill it now.
            await asyncio.wait_for(github.holding.wait(), 20)
            await first.kill()
            github.release()
            with sqlite3.connect(tmp_path / "state.db") as db:
                assert db.execute("SELECT status FROM outbox WHERE run_id = ?", (run_id,)).fetchall() == [("pending",)]

            await second.start()
            await _until(lambda: github.lists >= 1, timeout=20)
            with sqlite3.connect(tmp_path / "state.db") as db:
                await _until(lambda: db.execute("SELECT status, in_doubt, platform_message_id FROM outbox "
                                                "WHERE run_id = ?", (run_id,)).fetchall()[0][0] == "sent")
                [(_, in_doubt, message_id)] = db.execute(
                    "SELECT status, in_doubt, platform_message_id FROM outbox WHERE run_id = ?", (run_id,)).fetchall()
            [comment] = github.comments("acme/rocket#7")
            assert (in_doubt, message_id) == (1, str(comment["id"]))
            assert comment["body"].startswith("Echo: Review Faster countdown")
            assert comment["body"].endswith(f"\n\n{marker(f'run:{run_id}:0')}")
            assert github.posts == 1
            assert await second.terminate() == 0
    finally:
        for gw in (first, second):
            if gw.proc and gw.proc.returncode is None:
                await gw.kill()
        await model.stop()
