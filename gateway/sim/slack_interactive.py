"""Slack simulator, interactivity: Block Kit blocks on messages, button presses and ``response_url``.

``SlackSimulator`` (gateway/sim/slack_api.py) keeps each message's ``blocks`` as Slack does (``chat.update``
without ``blocks`` keeps them, ``blocks: []`` removes them), checked here against the Block Kit limits an
app meets with buttons. A press is a ``block_actions`` payload built here and delivered by the simulator like
any interaction (an ``interactive`` Socket Mode envelope, or a signed form post of ``payload=``), and each
interaction's ``response_url`` is served by :class:`ResponseUrls`, which records what the app posts there.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

__all__ = ["BlocksError", "ResponsePost", "ResponseUrls", "block_actions_payload", "find_button", "parse_blocks"]

JSON = dict[str, Any]

MAX_BLOCKS = 50
MAX_ELEMENTS = 25
MAX_SECTION_TEXT = 3000
MAX_BUTTON_TEXT = 75
MAX_BUTTON_VALUE = 2000
MAX_ID_LENGTH = 255
# A response_url takes up to 5 posts within 30 minutes.
RESPONSE_URL_USES = 5
RESPONSE_URL_LIFETIME = 30 * 60.0


class BlocksError(Exception):
    """Blocks Slack would refuse; ``error`` is the Web API error code."""

    def __init__(self, error: str, detail: str = "") -> None:
        super().__init__(f"{error}: {detail}" if detail else error)
        self.error = error


def parse_blocks(value: Any) -> list[JSON] | None:
    """The ``blocks`` argument (a list in JSON bodies, a JSON string in forms), checked; None when absent."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise BlocksError("invalid_blocks_format") from None
    if not isinstance(value, list) or not all(isinstance(b, dict) for b in value):
        raise BlocksError("invalid_blocks_format")
    _check(value)
    return value


def _check(blocks: list[JSON]) -> None:
    if len(blocks) > MAX_BLOCKS:
        raise BlocksError("invalid_blocks", f"more than {MAX_BLOCKS} blocks")
    block_ids: set[str] = set()
    action_ids: set[str] = set()
    for block in blocks:
        block_id = block.get("block_id")
        if block_id is not None:
            if not isinstance(block_id, str) or not 0 < len(block_id) <= MAX_ID_LENGTH or block_id in block_ids:
                raise BlocksError("invalid_blocks", f"bad or repeated block_id {block_id!r}")
            block_ids.add(block_id)
        kind = block.get("type")
        if kind == "section":
            _check_text(block.get("text"), MAX_SECTION_TEXT, ("plain_text", "mrkdwn"))
        elif kind == "actions":
            elements = block.get("elements")
            if not isinstance(elements, list) or not 0 < len(elements) <= MAX_ELEMENTS:
                raise BlocksError("invalid_blocks", f"an actions block needs 1 to {MAX_ELEMENTS} elements")
            for element in elements:
                _check_element(element, action_ids)
        elif not isinstance(kind, str):
            raise BlocksError("invalid_blocks", "a block without a type")


def _check_text(text: Any, limit: int, kinds: tuple[str, ...]) -> None:
    if not isinstance(text, dict) or text.get("type") not in kinds:
        raise BlocksError("invalid_blocks", f"a text object of type {'/'.join(kinds)} is required")
    body = text.get("text")
    if not isinstance(body, str) or not 0 < len(body) <= limit:
        raise BlocksError("invalid_blocks", f"text must be 1 to {limit} characters")


def _check_element(element: Any, action_ids: set[str]) -> None:
    if not isinstance(element, dict) or element.get("type") != "button":
        return  # only buttons are modelled; other elements pass
    _check_text(element.get("text"), MAX_BUTTON_TEXT, ("plain_text",))
    action_id = element.get("action_id")
    if not isinstance(action_id, str) or not 0 < len(action_id) <= MAX_ID_LENGTH or action_id in action_ids:
        raise BlocksError("invalid_blocks", f"bad or repeated action_id {action_id!r}")
    action_ids.add(action_id)
    value = element.get("value")
    if value is not None and (not isinstance(value, str) or len(value) > MAX_BUTTON_VALUE):
        raise BlocksError("invalid_blocks", f"a button value is at most {MAX_BUTTON_VALUE} characters")
    if element.get("style") not in (None, "primary", "danger"):
        raise BlocksError("invalid_blocks", f"unknown button style {element.get('style')!r}")


def find_button(blocks: list[JSON] | None, button: str) -> tuple[str, JSON]:
    """The block id and the button element whose ``action_id`` or label is ``button``; LookupError if none."""
    for n, block in enumerate(blocks or ()):
        if block.get("type") != "actions":
            continue
        for element in block.get("elements") or ():
            if element.get("type") == "button" and button in (element.get("action_id"),
                                                              (element.get("text") or {}).get("text")):
                # Slack fills in a block_id the app left out; it is stable per message.
                return block.get("block_id") or f"sim-block-{n}", element
    raise LookupError(f"no button {button!r} on the message")


def block_actions_payload(*, team_id: str, api_app_id: str, user: str, channel: str, message: JSON, block_id: str,
                          button: JSON, response_url: str, trigger_id: str) -> JSON:
    """The ``block_actions`` payload Slack sends when ``user`` presses ``button`` on ``message`` in ``channel``."""
    container: JSON = {"type": "message", "message_ts": message["ts"], "channel_id": channel, "is_ephemeral": False}
    if message.get("thread_ts"):
        container["thread_ts"] = message["thread_ts"]
    action: JSON = {"action_id": button["action_id"], "block_id": block_id, "text": button["text"],
                    "type": "button", "action_ts": f"{time.time():.6f}"}
    for key in ("value", "style"):
        if key in button:
            action[key] = button[key]
    return {
        "type": "block_actions", "token": "sim-verification-token", "api_app_id": api_app_id,
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": team_id},
        "container": container, "trigger_id": trigger_id, "team": {"id": team_id, "domain": "sim"},
        "enterprise": None, "is_enterprise_install": False,
        "channel": {"id": channel, "name": "directmessage" if channel.startswith("D") else "general"},
        "message": message, "state": {"values": {}}, "response_url": response_url, "actions": [action],
    }


@dataclass(slots=True, eq=False)
class ResponsePost:
    """One POST the app made to a ``response_url``, and what the simulator answered."""

    url: str
    body: JSON | None
    raw: bytes
    t: float
    status: int
    answer: str

    @property
    def text(self) -> str | None:
        """The posted ``text``."""
        return (self.body or {}).get("text")

    @property
    def ephemeral(self) -> bool:
        """Shown only to the user who interacted (``response_type`` other than ``in_channel``, Slack's default)."""
        return (self.body or {}).get("response_type") != "in_channel"


@dataclass(slots=True, eq=False)
class _Hook:
    url: str
    issued_t: float
    uses: int = 0


class ResponseUrls:
    """The simulator's ``response_url`` endpoints: one minted per interaction, each taking
    ``RESPONSE_URL_USES`` posts within ``RESPONSE_URL_LIFETIME`` seconds, every post recorded."""

    path = "/actions/{hook}"

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._hooks: dict[str, _Hook] = {}
        self._posts: list[ResponsePost] = []
        self._on_change = on_change

    def mint(self, base_url: str) -> str:
        """A fresh ``response_url`` under ``base_url`` (``http://127.0.0.1:PORT``)."""
        name = secrets.token_urlsafe(12)
        hook = self._hooks[name] = _Hook(f"{base_url}/actions/{name}", time.monotonic())
        return hook.url

    @property
    def posts(self) -> list[ResponsePost]:
        """Every post to any response_url, in order."""
        return list(self._posts)

    def posts_to(self, url: str) -> list[ResponsePost]:
        """The posts to one response_url."""
        return [p for p in self._posts if p.url == url]

    async def handle(self, request: web.Request) -> web.Response:
        """POST to a response_url: JSON with ``text`` or ``blocks`` (or ``delete_original``); answers ``ok``."""
        raw = await request.read()
        hook = self._hooks.get(request.match_info["hook"])
        body: JSON | None = None
        try:
            parsed = json.loads(raw)
            body = parsed if isinstance(parsed, dict) else None
        except ValueError:
            pass
        if hook is None:
            status, answer = 404, "no_service"
        elif time.monotonic() - hook.issued_t > RESPONSE_URL_LIFETIME:
            status, answer = 404, "expired_url"
        elif hook.uses >= RESPONSE_URL_USES:
            status, answer = 404, "used_url"
        elif body is None:
            status, answer = 400, "invalid_payload"
        elif not body.get("text") and not body.get("blocks") and not body.get("delete_original"):
            status, answer = 400, "no_text"
        else:
            status, answer = 200, "ok"
            hook.uses += 1
        self._posts.append(ResponsePost(hook.url if hook else str(request.url), body, raw, time.monotonic(), status,
                                        answer))
        self._on_change()
        return web.Response(status=status, text=answer)
