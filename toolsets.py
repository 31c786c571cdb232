"""Named toolsets: lists of tool names composed by ``includes``.

A toolset names tools; whether a tool exists or is available is the registry's
business. Resolution is cycle- and diamond-safe; ``all`` / ``*`` is the union of every
toolset; an unknown name resolves to nothing (logged once). Stdlib only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

# The tools every chat platform gets.
_HERMES_CORE_TOOLS: tuple[str, ...] = (
    "web_search",
    "web_extract",
    "read_file",
    "write_file",
    "patch",
    "search_files",
    "terminal",
    "memory",
    "todo",
    "clarify",
    "cronjob",
    "send_file",
    "vision_analyze",
    "delegate_task",
    "execute_code",
    "session_search",
    "send_message",
)

PLATFORMS: tuple[str, ...] = ("telegram", "discord", "slack", "webhook")

ALL_NAMES = frozenset({"all", "*"})


@dataclass(slots=True)
class Toolset:
    """A named set of tools plus the toolsets it includes.

    Not changed in place once in TOOLSETS: a toolset is replaced (``create_custom_toolset``), which is
    how cached resolutions (``resolve_toolset_traced``) notice the change.
    """

    description: str
    tools: list[str] = field(default_factory=list)
    includes: list[str] = field(default_factory=list)


TOOLSETS: dict[str, Toolset] = {
    "web": Toolset("Search the web and read pages (read-only).", ["web_search", "web_extract"]),
    "file": Toolset("Read, write, patch and search files in the workspace.",
                    ["read_file", "write_file", "patch", "search_files"]),
    "terminal": Toolset("Run shell commands in the workspace.", ["terminal"]),
    "memory": Toolset("Per-user notes that persist across sessions.", ["memory"]),
    "todo": Toolset("A per-session checklist.", ["todo"]),
    "clarify": Toolset("Ask the user a question and wait for the answer.", ["clarify"]),
    "cronjob": Toolset("Schedule prompts to run later or repeatedly.", ["cronjob"]),
    "media": Toolset("Send workspace files to the chat and look at images.", ["send_file", "vision_analyze"]),
    "delegation": Toolset("Hand sub-tasks to child agents with their own toolsets.", ["delegate_task"]),
    "code_execution": Toolset("Run Python in the sandbox, calling the session's other tools.", ["execute_code"]),
    "session_search": Toolset("Search the user's own past conversations.", ["session_search"]),
    "messaging": Toolset("Send a message to another chat the user may address.", ["send_message"]),
    "debugging": Toolset("Terminal plus web and file tools.", ["terminal"], ["web", "file"]),
    "safe": Toolset("Everything except running commands.", [],
                    ["web", "file", "memory", "todo", "clarify", "cronjob", "media", "session_search"]),
    "hermes-core": Toolset("The core tools every chat platform gets.", list(_HERMES_CORE_TOOLS)),
    "hermes-telegram": Toolset("Tools for Telegram sessions.", [], ["hermes-core"]),
    "hermes-discord": Toolset("Tools for Discord sessions.", [], ["hermes-core"]),
    "hermes-slack": Toolset("Tools for Slack sessions.", [], ["hermes-core"]),
    # Webhook payloads are untrusted: read-only web tools only, nothing that
    # writes, runs commands or sends messages.
    "hermes-webhook": Toolset("Restricted tools for webhook-triggered runs (read-only web).", ["web_extract",
                                                                                             "web_search"]),
    # Cron runs cannot ask questions (nobody is waiting), create further jobs or message other chats (their
    # answer goes to the chat that scheduled them; the config can add "messaging").
    "hermes-cron": Toolset("Tools for scheduled runs.",
                           [t for t in _HERMES_CORE_TOOLS if t not in ("cronjob", "clarify", "send_message")]),
    "hermes-gateway": Toolset("Union of every platform toolset.", [],
                              [f"hermes-{p}" for p in PLATFORMS]),
}


class ToolsetError(ValueError):
    """An invalid custom toolset, or a toolset asked for by name that does not exist."""


_unknown_logged: set[str] = set()


def _expand(name: str, tools: list[str], seen_tools: set[str], visited: dict[str, Toolset | None],
            stack: tuple[str, ...], toolsets: Mapping[str, Toolset]) -> None:
    if name in stack:
        logger.warning("toolset include cycle ignored: %s", " -> ".join((*stack, name)))
        return
    if name in visited:  # diamond: already expanded through another path
        return
    ts = visited[name] = toolsets.get(name)
    if ts is None:
        if name not in _unknown_logged:  # a set a config names is checked at load: this is a run-time leftover
            _unknown_logged.add(name)
            logger.warning("unknown toolset %r resolves to no tools; known: %s", name, ", ".join(sorted(toolsets)))
        return
    for tool in ts.tools:
        if tool not in seen_tools:
            seen_tools.add(tool)
            tools.append(tool)
    for inc in ts.includes:
        _expand(inc, tools, seen_tools, visited, (*stack, name), toolsets)


def resolve_toolset(names: str | Iterable[str], *, toolsets: Mapping[str, Toolset] | None = None) -> list[str]:
    """Tool names of one or more toolsets, includes expanded, first-seen order, no duplicates.

    ``all`` / ``*`` stand for the union of every toolset in the table (sorted by tool name). An unknown
    toolset name resolves to nothing (logged once); include cycles are logged and cut.
    """
    return _resolve(names, TOOLSETS if toolsets is None else toolsets)[0]


def resolve_toolset_traced(names: str | Iterable[str], *, toolsets: Mapping[str, Toolset] | None = None
                           ) -> tuple[list[str], dict[str, Toolset | None]]:
    """``resolve_toolset``, plus the toolsets it read (None for a name it did not find): the result holds
    while the table maps each of those names to the same object (still None: still unknown). For ``all``
    that is every toolset of the table; one added since is not among them."""
    return _resolve(names, TOOLSETS if toolsets is None else toolsets)


def _resolve(names: str | Iterable[str], table: Mapping[str, Toolset]
             ) -> tuple[list[str], dict[str, Toolset | None]]:
    requested = [names] if isinstance(names, str) else list(names)
    tools: list[str] = []
    seen: set[str] = set()
    visited: dict[str, Toolset | None] = {}
    for name in requested:
        if name in ALL_NAMES:
            snapshot = dict(table)  # another thread may add a source's toolset meanwhile
            visited.update(snapshot)
            for tool in sorted({t for ts in snapshot.values() for t in ts.tools} - seen):
                seen.add(tool)
                tools.append(tool)
            continue
        _expand(name, tools, seen, visited, (), table)
    return tools, visited


def validate_toolset(name: str, toolsets: Mapping[str, Toolset] | None = None) -> bool:
    """Whether ``name`` is a known toolset (or ``all`` / ``*``)."""
    table = TOOLSETS if toolsets is None else toolsets
    return name in ALL_NAMES or name in table


def create_custom_toolset(name: str, description: str, tools: Iterable[str] = (),
                          includes: Iterable[str] = ()) -> Toolset:
    """Add (or replace) a toolset in TOOLSETS; every include must already exist."""
    includes = list(includes)
    missing = [i for i in includes if not validate_toolset(i)]
    if missing:
        raise ToolsetError(f"toolset {name!r} includes unknown toolsets: {', '.join(missing)}")
    ts = Toolset(description, list(tools), includes)
    TOOLSETS[name] = ts
    return ts


SOURCE_PREFIXES = ("mcp-", "plugin-")


def set_source_toolset(name: str, description: str, tools: Iterable[str]) -> Toolset:
    """Create or replace the runtime toolset of a tool source (``mcp-<server>`` or ``plugin-<name>``).

    Replacing is one dict assignment, so readers on other threads see the old or the new list.
    No built-in ``hermes-*`` set includes them: a platform gets them when the ``toolsets`` config names
    them, or when it is the plugin's own platform (``set_plugin_platform_toolset``).
    """
    if not name.startswith(SOURCE_PREFIXES):
        raise ToolsetError(f"tool source toolset {name!r} must start with mcp- or plugin-")
    return create_custom_toolset(name, description, tools)


def remove_source_toolset(name: str) -> None:
    """Drop a tool source's toolset (its server or plugin is gone), or a plugin platform's ``hermes-<platform>``
    made by ``set_plugin_platform_toolset``; no-op when absent."""
    if name.startswith(SOURCE_PREFIXES):
        TOOLSETS.pop(name, None)
    elif (made := _PLATFORM_TOOLSETS.pop(name, None)) is not None and TOOLSETS.get(name) is made:
        del TOOLSETS[name]


_PLATFORM_TOOLSETS: dict[str, Toolset] = {}  # the hermes-<platform> sets made for plugin platforms


def set_plugin_platform_toolset(platform: str, source: str) -> Toolset | None:
    """``hermes-<platform>`` for a platform a plugin registers: the core tools plus that plugin's toolset
    (``source``, ``plugin-<name>``). A toolset of that name defined otherwise stays as it is (None).
    ``remove_source_toolset`` drops it again."""
    name = f"hermes-{platform}"
    current = TOOLSETS.get(name)
    if current is not None and _PLATFORM_TOOLSETS.get(name) is not current:
        return None
    ts = Toolset(f"Tools for {platform} sessions (a plugin platform): the core tools and those of {source}.",
                 [], ["hermes-core", source])
    TOOLSETS[name] = _PLATFORM_TOOLSETS[name] = ts
    return ts


def toolset_for_platform(platform: str, overrides: Mapping[str, str | list[str]] | None = None) -> list[str]:
    """The toolset names a platform's sessions use: the config override, else ``hermes-<platform>``."""
    if overrides and platform in overrides:
        value = overrides[platform]
        return [value] if isinstance(value, str) else list(value)
    return [f"hermes-{platform}"]


def core_tools() -> frozenset[str]:
    """Names of the core tools (never deferred by tool search)."""
    return frozenset(_HERMES_CORE_TOOLS)
