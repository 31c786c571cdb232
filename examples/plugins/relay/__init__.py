"""Relay: an example platform plugin for hermes-gateway.

Put this package in ``plugins.dir`` (or point ``plugins.dir`` at ``examples/plugins``) and configure::

    platforms:
      relay:
        plugin: relay
        url: http://127.0.0.1:8765
        token: ${RELAY_TOKEN}
    auth:
      platforms:
        relay: {allowed_users: [u1]}

It provides the ``relay`` platform (a tiny JSON-over-HTTP chat service, long-polled; ``adapter.py``; a simulator
of the service is ``gateway/sim/relay_api.py``), the tool ``relay_shout`` (so ``hermes-relay``, the toolset its
sessions get, is the core tools plus ``relay_shout``), the command ``/relay``, and two hooks: a note added to
each model request of a Relay session, and a count of the tool calls that ``/relay`` shows.

The tool sandbox loads plugins too (to run their tools), and sees only the ``tools`` package and the installed
libraries: this module and ``settings.py`` import nothing else, and the adapter (``platforms.base``) is imported
when the gateway builds it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from .settings import RelaySettings

NOTE = "Relay shows plain text only: answer without Markdown."

_calls: Counter[str] = Counter()  # tool calls seen by the post_tool_call hook, by tool
_calls_lock = threading.Lock()  # hooks run on the gateway's tool threads


def _shout(args: dict[str, Any], **ctx: Any) -> str:
    return str(args["text"]).upper() + "!"


def _note(messages: list[dict[str, Any]], ctx: Mapping[str, Any]) -> str | None:
    """pre_llm_call: what a Relay session's model request is told besides the conversation."""
    return NOTE if ctx.get("platform") == "relay" else None


def _count(name: str, args: dict[str, Any], result: str, seconds: float, ctx: Mapping[str, Any]) -> None:
    """post_tool_call: count every tool call the gateway makes."""
    with _calls_lock:
        _calls[name] += 1


async def _relay_command(ctx: Any) -> str:
    """/relay: the tool calls counted since the plugin loaded."""
    with _calls_lock:
        seen = ", ".join(f"{name} x{n}" for name, n in sorted(_calls.items())) or "none"
    return f"Relay plugin here ({ctx.event.platform}). Tool calls seen: {seen}."


def _adapter(settings: RelaySettings) -> Any:
    """The platform's adapter; its module needs the gateway's ``platforms`` package, which the sandbox lacks."""
    from .adapter import RelayAdapter

    return RelayAdapter(settings)


def register(ctx: Any) -> None:
    """Called by the gateway's plugin loader with its PluginContext."""
    ctx.register_platform("relay", _adapter, RelaySettings)
    ctx.register_tool("relay_shout", "plugin-relay", {
        "description": "Repeat a text in capitals, with an exclamation mark.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "what to shout"}},
                       "required": ["text"]},
    }, _shout, emoji="📣")
    ctx.register_command("relay", "the Relay plugin's tool-call counts", _relay_command)
    ctx.register_hook("pre_llm_call", _note)
    ctx.register_hook("post_tool_call", _count)
