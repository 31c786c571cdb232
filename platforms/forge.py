"""Delivery back to the source: a run's answer as a comment on the GitHub issue or pull request, or the GitLab issue
or merge request, whose webhook started it.

The thread is bound when the webhook is accepted (``source_thread`` of its payload, kept in the event's metadata and
so in the run's stored target): a restart answers in the same place. Chat ids: GitHub ``owner/repo#123``, GitLab
``<project id>#<iid>`` for an issue and ``<project id>!<iid>`` for a merge request (GitLab's own notation).

Exactly once: each comment ends with an invisible marker naming its outbox delivery key. A part in doubt (its
sender died between the POST and recording it) is first looked up among the thread's comments; found, it counts
as sent.
"""

from __future__ import annotations

import abc
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import quote

import aiohttp

from platforms.base import SendResult
from platforms.http_target import HttpTargetAdapter

logger = logging.getLogger(__name__)

FORGES = ("github", "gitlab")
_MARKER = "<!-- hermes-gateway:part:{} -->"
_NEXT_LINK = re.compile(r'<([^>]+)>;\s*rel="next"')
_MAX_PAGES = 100  # a lookup reads at most this many pages of 100 comments


def marker(delivery_id: str) -> str:
    """The invisible HTML comment that tags a posted part with its delivery key."""
    return _MARKER.format(delivery_id)


def _get(payload: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(payload, Mapping):
            return None
        payload = payload.get(key)
    return payload


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def github_thread(payload: Any) -> str | None:
    """``owner/repo#n`` of the pull request or issue a GitHub event is about, if any."""
    repo = _get(payload, "repository", "full_name")
    number = _number(_get(payload, "pull_request", "number")) or _number(_get(payload, "issue", "number"))
    if isinstance(repo, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", repo) and number:
        return f"{repo}#{number}"
    return None


def gitlab_thread(payload: Any) -> str | None:
    """``<project>#<iid>`` (issue) or ``<project>!<iid>`` (merge request) a GitLab event is about, if any."""
    project = _number(_get(payload, "project", "id"))
    kind = _get(payload, "object_kind")
    if project is None or not isinstance(kind, str):
        return None
    if kind in ("issue", "work_item") and (iid := _number(_get(payload, "object_attributes", "iid"))):
        return f"{project}#{iid}"
    if kind == "merge_request" and (iid := _number(_get(payload, "object_attributes", "iid"))):
        return f"{project}!{iid}"
    if kind == "note":  # a comment: answer in the thread it was made in
        if iid := _number(_get(payload, "merge_request", "iid")):
            return f"{project}!{iid}"
        if iid := _number(_get(payload, "issue", "iid")):
            return f"{project}#{iid}"
    return None


def source_thread(payload: Any) -> str | None:
    """``<forge>:<chat id>``: where ``deliver_to: github|gitlab`` answers this payload; None when nowhere."""
    if thread := github_thread(payload):
        return f"github:{thread}"
    if thread := gitlab_thread(payload):
        return f"gitlab:{thread}"
    return None


@dataclass(slots=True, frozen=True)
class ForgeSettings:
    """Credentials and endpoint of one forge's REST API."""

    token: str
    api_base_url: str
    timeout: float = 10.0


class _ForgeAdapter(HttpTargetAdapter):
    """Comments on a forge's threads: POST to ``_comments_url``, look up markers in its listing."""

    can_edit = False
    user_agent: ClassVar[str] = "hermes-gateway"

    def __init__(self, settings: ForgeSettings) -> None:
        super().__init__()
        self.settings = settings

    @abc.abstractmethod
    def _comments_url(self, chat_id: str) -> str | None:
        """The comments (notes) collection of the thread ``chat_id``; None when it names no thread."""

    @abc.abstractmethod
    def _headers(self) -> dict[str, str]:
        """Authentication and API version headers of every request."""

    def _new_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers={"User-Agent": self.user_agent, **self._headers()},
                                     timeout=aiohttp.ClientTimeout(total=self.settings.timeout))

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        """Post ``content`` as a comment on the thread ``chat_id``, tagged with the part's delivery key."""
        url = self._comments_url(chat_id)
        if url is None:
            return SendResult(success=False, error=f"not a {self.name} thread: {chat_id!r}")
        if self._session is None:
            return SendResult(success=False, error=f"{self.name} platform not connected", retryable=True)
        meta = metadata or {}
        delivery = meta.get("delivery_id")
        body = f"{content}\n\n{marker(delivery)}" if delivery else content
        try:
            if delivery and meta.get("in_doubt"):
                found = await self._posted_before(url, marker(delivery))
                if isinstance(found, SendResult):
                    return found
                if found is not None:
                    logger.info("%s: %s was already posted on %s before the restart (comment %s); not posting it "
                                "again", self.name, delivery, chat_id, found)
                    return SendResult(success=True, message_id=found)
            async with self._session.post(url, json={"body": body}) as resp:
                if resp.status in (200, 201):
                    return SendResult(success=True, message_id=str((await resp.json())["id"]))
                return await self._failure(resp)
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
            return SendResult(success=False, error=f"{type(exc).__name__}: {exc}", retryable=True)

    async def _posted_before(self, url: str, tag: str) -> str | SendResult | None:
        """The id of a comment on the thread carrying ``tag``; a failed listing as its SendResult; else None."""
        assert self._session is not None
        page: str | None = f"{url}?per_page=100"
        for _ in range(_MAX_PAGES):
            if page is None:
                return None
            async with self._session.get(page) as resp:
                if resp.status != 200:
                    return await self._failure(resp)
                for comment in await resp.json():
                    if isinstance(comment, dict) and tag in str(comment.get("body", "")):
                        return str(comment["id"])
                match = _NEXT_LINK.search(resp.headers.get("Link", ""))
                page = match.group(1) if match else None
        logger.warning("%s: more than %d pages of comments on %s; looked at the first ones only", self.name,
                       _MAX_PAGES, url)
        return None

    async def _failure(self, resp: aiohttp.ClientResponse) -> SendResult:
        """A non-2xx answer as a SendResult: rate limits and server errors are retried, the rest is not."""
        text = (await resp.text())[:200]
        retry_after = resp.headers.get("Retry-After")
        limited = resp.status == 429 or (resp.status == 403 and (
            retry_after is not None or resp.headers.get("x-ratelimit-remaining") == "0"))
        return SendResult(success=False, error=f"HTTP {resp.status}: {text}", retryable=limited or resp.status >= 500,
                          retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None)


class GitHubAdapter(_ForgeAdapter):
    """Comments on GitHub issues and pull requests (REST: ``/repos/{owner}/{repo}/issues/{n}/comments``)."""

    name = "github"
    max_message_length = 60_000  # GitHub refuses bodies over 65,536 characters

    def _comments_url(self, chat_id: str) -> str | None:
        match = re.fullmatch(r"([\w.-]+)/([\w.-]+)#(\d+)", chat_id)
        if match is None:
            return None
        owner, repo, number = match.groups()
        return f"{self.settings.api_base_url.rstrip('/')}/repos/{owner}/{repo}/issues/{number}/comments"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.settings.token}", "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28"}


class GitLabAdapter(_ForgeAdapter):
    """Notes on GitLab issues and merge requests (REST: ``/projects/{id}/issues|merge_requests/{iid}/notes``)."""

    name = "gitlab"
    max_message_length = 100_000  # GitLab allows 1,000,000

    def _comments_url(self, chat_id: str) -> str | None:
        match = re.fullmatch(r"([^#!]+)([#!])(\d+)", chat_id)
        if match is None:
            return None
        project, kind, iid = match.groups()
        things = "issues" if kind == "#" else "merge_requests"
        return f"{self.settings.api_base_url.rstrip('/')}/projects/{quote(project, safe='')}/{things}/{iid}/notes"

    def _headers(self) -> dict[str, str]:
        return {"PRIVATE-TOKEN": self.settings.token}
