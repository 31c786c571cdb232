"""The Discord simulator's interactions: message components, button presses, slash commands and their answers.

``DiscordSimulator`` mixes this in. Drivers: ``user_presses`` (a user presses a button on a bot message) and
``user_invokes`` (a user runs a registered slash command), each dispatching INTERACTION_CREATE with the payload
Discord sends. REST, as on Discord: ``POST /interactions/{id}/{token}/callback`` (once per interaction, within
``ack_deadline`` seconds), ``GET/PATCH/DELETE /webhooks/{app}/{token}/messages/@original``, follow-ups
``POST /webhooks/{app}/{token}`` (valid for ``token_ttl`` seconds), and the bulk overwrite and listing of global
and guild application commands with Discord's name and description rules. Readers: ``callbacks``,
``wait_for_callback``, ``original_response``, ``followups``, ``application_commands``.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "INTERACTION_ROUTES",
    "INTERACTION_UNAUTHENTICATED",
    "TEXT_PARAMS",
    "InteractionCallback",
    "InteractionsMixin",
    "SimInteraction",
]

JSON = dict[str, Any]

_ORIGINAL = r"/webhooks/(?P<application_id>\d+)/(?P<token>[^/]+)/messages/@original"
INTERACTION_ROUTES: tuple[tuple[str, str, str], ...] = (
    ("POST", r"/interactions/(?P<interaction_id>\d+)/(?P<token>[^/]+)/callback", "interaction_callback"),
    ("GET", _ORIGINAL, "get_original"),
    ("PATCH", _ORIGINAL, "edit_original"),
    ("DELETE", _ORIGINAL, "delete_original"),
    ("POST", r"/webhooks/(?P<application_id>\d+)/(?P<token>[^/]+)", "followup"),
    ("GET", r"/applications/(?P<application_id>\d+)/commands", "global_commands"),
    ("PUT", r"/applications/(?P<application_id>\d+)/commands", "put_global_commands"),
    ("GET", r"/applications/(?P<application_id>\d+)/guilds/(?P<guild_id>\d+)/commands", "guild_commands"),
    ("PUT", r"/applications/(?P<application_id>\d+)/guilds/(?P<guild_id>\d+)/commands", "put_guild_commands"),
)
"""(method, path pattern, route name) of the endpoints served here; the handler of ``name`` is ``_rest_<name>``."""
INTERACTION_UNAUTHENTICATED = frozenset({"interaction_callback", "get_original", "edit_original", "delete_original",
                                         "followup"})
"""Routes authorized by the interaction token in the path, not by the bot token."""
TEXT_PARAMS = frozenset({"token"})
"""Path parameters that stay strings (the others are snowflakes)."""

INTERACTION_PING, INTERACTION_COMMAND, INTERACTION_COMPONENT = 1, 2, 3
CALLBACK_MESSAGE, CALLBACK_DEFERRED_MESSAGE, CALLBACK_DEFERRED_UPDATE, CALLBACK_UPDATE = 4, 5, 6, 7
_ALLOWED_CALLBACKS = {INTERACTION_COMMAND: frozenset({4, 5, 9}), INTERACTION_COMPONENT: frozenset({4, 5, 6, 7, 9})}
_FLAG_EPHEMERAL, _FLAG_LOADING = 1 << 6, 1 << 7
_MESSAGE_CHAT_INPUT_COMMAND = 20
_COMPONENT_ROW, _COMPONENT_BUTTON = 1, 2
_BUTTON_LINK, _BUTTON_PREMIUM = 5, 6
_MAX_ROWS, _MAX_ROW_ITEMS, _MAX_CUSTOM_ID, _MAX_LABEL = 5, 5, 100, 80
_MAX_COMMANDS, _MAX_OPTIONS, _MAX_NAME, _MAX_DESCRIPTION = 100, 25, 32, 100
_PERMISSIONS = "1071698660929"
_ALICE_ID, _GENERAL_ID = 2001, 3001  # discord_api's ALICE_ID and GENERAL_ID: the drivers' defaults there too
_ATTACHMENT_SIZE_LIMIT = 10 * 1024 * 1024


@dataclass(slots=True, frozen=True)
class InteractionCallback:
    """One ``POST /interactions/{id}/{token}/callback`` the simulator accepted."""

    interaction_id: int
    type: int
    data: JSON
    t: float


@dataclass(slots=True, eq=False)
class SimInteraction:
    """An interaction a driver started, and what the bot did with it."""

    id: int
    type: int
    token: str
    channel_id: int
    user_id: int
    payload: JSON
    created: float
    callback: InteractionCallback | None = None
    original_id: int | None = None
    followups: list[int] = field(default_factory=list)
    expired: bool = False


def _form_error(errors: JSON) -> tuple[int, int, str, JSON]:
    return 400, 50035, "Invalid Form Body", errors


def _error(code: str, message: str) -> JSON:
    return {"_errors": [{"code": code, "message": message}]}


def _name_problem(name: Any) -> str | None:
    """Why Discord refuses a command or option name (``^[-_\\p{L}\\p{N}]{1,32}$``, lower case), or None."""
    if not isinstance(name, str) or not 1 <= len(name) <= _MAX_NAME:
        return f"Must be between 1 and {_MAX_NAME} in length."
    if not all(c.isalnum() or c in "-_" for c in name) or name.lower() != name:
        return "Command name is invalid"
    return None


def _description_problem(description: Any) -> str | None:
    if not isinstance(description, str) or not 1 <= len(description) <= _MAX_DESCRIPTION:
        return f"Must be between 1 and {_MAX_DESCRIPTION} in length."
    return None


class InteractionsMixin:
    """Components, interactions and application commands for ``DiscordSimulator`` (which provides the model)."""

    ack_deadline: float = 3.0
    """Seconds within which an interaction must get its callback (later: 404 Unknown interaction)."""
    token_ttl: float = 900.0
    """Seconds an interaction token answers @original and follow-ups (later: 401 Invalid Webhook Token)."""

    # Provided by DiscordSimulator.
    bot_user: JSON
    _users: dict[int, JSON]
    _messages: dict[int, JSON]
    _bot_created: list[int]
    _api_error: Callable[..., Exception]
    _channel: Callable[[int], JSON]
    _guild_of: Callable[[JSON], int | None]
    _new_id: Callable[[], int]
    _changed: Callable[[], None]
    _check_content: Callable[[Any], str]
    _post: Callable[..., JSON]
    _dispatch: Callable[[str, JSON, int | None], None]
    _guilds: dict[int, JSON]
    _rest_edit_message: Callable[..., Awaitable[tuple[int, Any]]]
    _rest_delete_message: Callable[..., Awaitable[tuple[int, Any]]]
    wait_for: Callable[..., Awaitable[Any]]

    def __init__(self) -> None:
        self._interactions: dict[int, SimInteraction] = {}
        self._callbacks: list[InteractionCallback] = []
        self._commands: dict[int | None, dict[str, JSON]] = {}  # guild id (None: global) -> name -> command
        self._command_versions = itertools.count(1)

    # ----------------------------------------------------------------- drivers

    def user_presses(self, message_id: int, custom_id: str | None = None, *, label: str | None = None,
                     user_id: int = _ALICE_ID) -> JSON:
        """A user presses a button (by ``custom_id``, or by ``label``) on a bot message: INTERACTION_CREATE type 3.

        Returns the interaction payload (``id``, ``token`` ...). Raises ValueError for a button that is not there.
        """
        message = self._messages.get(message_id)
        if message is None or message["author"]["id"] != self.bot_user["id"]:
            raise ValueError(f"no bot message {message_id}")
        buttons = [c for row in message.get("components", []) for c in row.get("components", [])
                   if c.get("type") == _COMPONENT_BUTTON and "custom_id" in c and not c.get("disabled")]
        button = next((b for b in buttons if (custom_id is None or b["custom_id"] == custom_id)
                       and (label is None or b.get("label") == label)), None)
        if button is None:
            raise ValueError(f"message {message_id} has no enabled button {custom_id or label!r}")
        data = {"custom_id": button["custom_id"], "component_type": _COMPONENT_BUTTON}
        return self._interact(INTERACTION_COMPONENT, int(message["channel_id"]), user_id, data, message=message)

    def user_invokes(self, name: str, options: Mapping[str, Any] | None = None, *, channel_id: int = _GENERAL_ID,
                     user_id: int = _ALICE_ID) -> JSON:
        """A user runs the registered slash command ``name`` in a channel, thread or DM: INTERACTION_CREATE type 2.

        ``options`` maps option names to values. Returns the interaction payload. Raises ValueError for a command
        (or option) not registered where the channel is (its guild's commands, else the global ones).
        """
        guild_id = self._guild_of(self._channel(channel_id))
        command = (self._commands.get(guild_id, {}) if guild_id is not None else {}).get(name) \
            or self._commands.get(None, {}).get(name)
        if command is None:
            raise ValueError(f"no command {name!r} registered for channel {channel_id}")
        defined = {o["name"]: o for o in command.get("options", [])}
        unknown = set(options or {}) - set(defined)
        if unknown:
            raise ValueError(f"command {name!r} has no options {sorted(unknown)}")
        data: JSON = {"id": command["id"], "name": name, "type": command["type"]}
        if options:
            data["options"] = [{"name": k, "type": defined[k]["type"], "value": v} for k, v in options.items()]
        if command.get("guild_id"):
            data["guild_id"] = command["guild_id"]
        return self._interact(INTERACTION_COMMAND, channel_id, user_id, data)

    def expire_interaction(self, interaction_id: int) -> None:
        """Make an interaction's token invalid now, as Discord does ``token_ttl`` seconds after it was created."""
        self._interactions[interaction_id].expired = True

    # ----------------------------------------------------------------- readers

    def callbacks(self, interaction_id: int | None = None) -> list[InteractionCallback]:
        """Accepted interaction callbacks in order (all, or one interaction's)."""
        return [c for c in self._callbacks if interaction_id is None or c.interaction_id == interaction_id]

    async def wait_for_callback(self, interaction_id: int, timeout: float = 5.0) -> InteractionCallback:
        """Wait until the interaction got its callback; return it."""
        return await self.wait_for(lambda: self._interactions[interaction_id].callback, timeout)

    def original_response(self, interaction_id: int) -> JSON | None:
        """The message @original names now (the response message, or for a deferred update the message
        carrying the component), or None before a callback made one."""
        original_id = self._interactions[interaction_id].original_id
        return self._messages.get(original_id) if original_id is not None else None

    def followups(self, interaction_id: int) -> list[JSON]:
        """Follow-up messages of an interaction that still exist, in order."""
        return [self._messages[m] for m in self._interactions[interaction_id].followups if m in self._messages]

    def application_commands(self, guild_id: int | None = None) -> list[JSON]:
        """The registered global commands, or one guild's."""
        return list(self._commands.get(guild_id, {}).values())

    # ----------------------------------------------------------------- components

    def _components(self, components: Any) -> list[JSON]:
        """Message components checked as Discord does (rows of at most 5 buttons, unique custom ids)."""
        if components is None:
            return []
        errors: JSON = {}
        seen: set[str] = set()
        if not isinstance(components, list) or len(components) > _MAX_ROWS:
            errors["components"] = _error("BASE_TYPE_BAD_LENGTH", f"Must be between 0 and {_MAX_ROWS} in length.")
        else:
            for r, row in enumerate(components):
                items = row.get("components") if isinstance(row, dict) else None
                if row.get("type") != _COMPONENT_ROW or not isinstance(items, list) \
                        or not 1 <= len(items) <= _MAX_ROW_ITEMS:
                    errors[f"components.{r}"] = _error("COMPONENT_LAYOUT_WIDTH_EXCEEDED", "Invalid action row")
                    continue
                for i, item in enumerate(items):
                    if problem := self._button_problem(item, seen):
                        errors[f"components.{r}.components.{i}"] = _error("COMPONENT_INVALID", problem)
        if errors:
            raise self._api_error(*_form_error(errors))
        return components

    @staticmethod
    def _button_problem(item: Any, seen: set[str]) -> str | None:
        if not isinstance(item, dict) or item.get("type") != _COMPONENT_BUTTON:
            return "Only buttons are simulated"
        label = item.get("label")
        if label is not None and (not isinstance(label, str) or len(label) > _MAX_LABEL):
            return f"label: Must be {_MAX_LABEL} or fewer in length."
        style = item.get("style")
        if style == _BUTTON_LINK:
            return None if item.get("url") and "custom_id" not in item else "A link button needs a url, no custom_id"
        if style not in (1, 2, 3, 4) and style != _BUTTON_PREMIUM:
            return "style: Value must be one of (1, 2, 3, 4, 5, 6)."
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= _MAX_CUSTOM_ID:
            return f"custom_id: Must be between 1 and {_MAX_CUSTOM_ID} in length."
        if custom_id in seen:
            return "Component custom id cannot be duplicated"
        seen.add(custom_id)
        return None

    # ----------------------------------------------------------------- interactions

    def _interact(self, kind: int, channel_id: int, user_id: int, data: JSON, message: JSON | None = None) -> JSON:
        channel = self._channel(channel_id)
        guild_id = self._guild_of(channel)
        user = self._users[user_id]
        iid = self._new_id()
        token = "aW50ZXJhY3Rpb246" + secrets.token_urlsafe(96)
        payload: JSON = {
            "id": str(iid), "application_id": self.bot_user["id"], "type": kind, "token": token, "version": 1,
            "data": data, "channel_id": str(channel_id), "channel": dict(channel), "locale": "en-US",
            "app_permissions": _PERMISSIONS, "entitlements": [], "attachment_size_limit": _ATTACHMENT_SIZE_LIMIT,
            "context": 0 if guild_id is not None else 1,
            "authorizing_integration_owners": {"0": str(guild_id)} if guild_id is not None else {"1": str(user_id)},
        }
        if guild_id is not None:
            payload.update(guild_id=str(guild_id), guild_locale="en-US",
                           guild={"id": str(guild_id), "locale": "en-US", "features": []},
                           member={"user": user, "roles": [], "joined_at": "2024-01-01T00:00:00+00:00",
                                   "deaf": False, "mute": False, "flags": 0, "nick": None, "avatar": None,
                                   "pending": False, "permissions": _PERMISSIONS})
        else:
            payload["user"] = user
        if message is not None:
            payload["message"] = dict(message)
        self._interactions[iid] = SimInteraction(iid, kind, token, channel_id, user_id, payload, time.monotonic())
        self._dispatch("INTERACTION_CREATE", payload, guild_id)
        self._changed()
        return payload

    def _by_id(self, interaction_id: int, token: str) -> SimInteraction:
        found = self._interactions.get(interaction_id)
        if found is None or not secrets.compare_digest(found.token, token) or found.expired \
                or (found.callback is None and time.monotonic() - found.created > self.ack_deadline):
            raise self._api_error(404, 10062, "Unknown interaction")
        return found

    def _by_token(self, application_id: int, token: str) -> SimInteraction:
        found = next((i for i in self._interactions.values() if secrets.compare_digest(i.token, token)), None)
        if found is None or application_id != int(self.bot_user["id"]):
            raise self._api_error(404, 10015, "Unknown Webhook")
        if found.expired or time.monotonic() - found.created > self.token_ttl:
            raise self._api_error(401, 50027, "Invalid Webhook Token")
        return found

    def _respond(self, it: SimInteraction, body: JSON, *, loading: bool) -> JSON:
        """A message answering an interaction, posted in its channel by the bot (an ephemeral one too, flagged 64:
        on Discord only the user sees it)."""
        components = self._components(body.get("components"))
        content = self._check_content(body.get("content"))
        flags = (int(body.get("flags") or 0) & _FLAG_EPHEMERAL) | (_FLAG_LOADING if loading else 0)
        fields: JSON = {"components": components, "flags": flags,
                        "webhook_id": self.bot_user["id"], "application_id": self.bot_user["id"],
                        "interaction_metadata": {"id": str(it.id), "type": it.type, "user": self._users[it.user_id],
                                                 "authorizing_integration_owners": {}}}
        if it.type == INTERACTION_COMMAND:
            fields["type"] = _MESSAGE_CHAT_INPUT_COMMAND
        message = self._post(self._channel(it.channel_id), self.bot_user, content,
                             allowed=body.get("allowed_mentions"), fields=fields)
        self._bot_created.append(int(message["id"]))
        return message

    async def _rest_interaction_callback(self, call: Any, interaction_id: int, token: str) -> tuple[int, Any]:
        it = self._by_id(interaction_id, token)
        if it.callback is not None:
            raise self._api_error(400, 40060, "Interaction has already been acknowledged.")
        body = call.body if isinstance(call.body, dict) else {}
        kind = body.get("type")
        if kind not in _ALLOWED_CALLBACKS.get(it.type, frozenset()):
            raise self._api_error(*_form_error({"type": _error("BASE_TYPE_CHOICES", "Value must be one of "
                                                               f"{sorted(_ALLOWED_CALLBACKS[it.type])}.")}))
        data = body.get("data") if isinstance(body.get("data"), dict) else {}
        message: JSON | None = None
        if kind in (CALLBACK_MESSAGE, CALLBACK_DEFERRED_MESSAGE):
            if kind == CALLBACK_MESSAGE and not data.get("content") and not data.get("components"):
                raise self._api_error(400, 50006, "Cannot send an empty message")
            message = self._respond(it, data if kind == CALLBACK_MESSAGE else {}, loading=kind == 5)
            it.original_id = int(message["id"])
        elif kind in (CALLBACK_DEFERRED_UPDATE, CALLBACK_UPDATE):
            it.original_id = int(it.payload["message"]["id"])
            if kind == CALLBACK_UPDATE:
                _, message = await self._edit(call, it, data)
        it.callback = InteractionCallback(it.id, kind, data, time.monotonic())
        self._callbacks.append(it.callback)
        self._changed()
        if call.query.get("with_response") not in ("1", "true", "True"):
            return 204, None
        response: JSON = {"id": str(it.id), "type": it.type, "response_message_loading": kind == 5,
                          "response_message_ephemeral": bool(int(data.get("flags") or 0) & _FLAG_EPHEMERAL)}
        resource: JSON = {"type": kind}
        if message is not None:
            response["response_message_id"] = message["id"]
            resource["message"] = message
        return 200, {"interaction": response, "resource": resource}

    async def _edit(self, call: Any, it: SimInteraction, body: JSON) -> tuple[int, Any]:
        """Edit the message @original names, through the channel message edit (same rules and events)."""
        if it.original_id is None or it.original_id not in self._messages:
            raise self._api_error(404, 10008, "Unknown Message")
        message = self._messages[it.original_id]
        message["flags"] = int(message.get("flags") or 0) & ~_FLAG_LOADING
        return await self._rest_edit_message(_Body(body, call.query), int(message["channel_id"]), it.original_id)

    async def _rest_get_original(self, call: Any, application_id: int, token: str) -> tuple[int, Any]:
        it = self._by_token(application_id, token)
        if it.original_id is None or it.original_id not in self._messages:
            raise self._api_error(404, 10008, "Unknown Message")
        return 200, self._messages[it.original_id]

    async def _rest_edit_original(self, call: Any, application_id: int, token: str) -> tuple[int, Any]:
        it = self._by_token(application_id, token)
        return await self._edit(call, it, call.body if isinstance(call.body, dict) else {})

    async def _rest_delete_original(self, call: Any, application_id: int, token: str) -> tuple[int, Any]:
        it = self._by_token(application_id, token)
        if it.original_id is None or it.original_id not in self._messages:
            raise self._api_error(404, 10008, "Unknown Message")
        return await self._rest_delete_message(call, it.channel_id, it.original_id)

    async def _rest_followup(self, call: Any, application_id: int, token: str) -> tuple[int, Any]:
        it = self._by_token(application_id, token)
        if it.callback is None:
            raise self._api_error(404, 10015, "Unknown Webhook")
        body = call.body if isinstance(call.body, dict) else {}
        original = self._messages.get(it.original_id) if it.original_id is not None else None
        if original is not None and int(original.get("flags") or 0) & _FLAG_LOADING:
            _, message = await self._edit(call, it, body)  # the first follow-up replaces a deferred "thinking..."
        else:
            if not body.get("content") and not body.get("components"):
                raise self._api_error(400, 50006, "Cannot send an empty message")
            message = self._respond(it, body, loading=False)
            it.followups.append(int(message["id"]))
        wait = call.query.get("wait") in ("1", "true", "True")
        return (200, message) if wait else (204, None)

    # ----------------------------------------------------------------- application commands

    def _check_application(self, application_id: int) -> None:
        if application_id != int(self.bot_user["id"]):
            raise self._api_error(403, 50001, "Missing Access")

    def _check_guild(self, guild_id: int) -> None:
        if guild_id not in self._guilds:
            raise self._api_error(404, 10004, "Unknown Guild")

    async def _rest_global_commands(self, call: Any, application_id: int) -> tuple[int, Any]:
        self._check_application(application_id)
        return 200, self.application_commands()

    async def _rest_guild_commands(self, call: Any, application_id: int, guild_id: int) -> tuple[int, Any]:
        self._check_application(application_id)
        self._check_guild(guild_id)
        return 200, self.application_commands(guild_id)

    async def _rest_put_global_commands(self, call: Any, application_id: int) -> tuple[int, Any]:
        self._check_application(application_id)
        return 200, self._overwrite(None, call.body)

    async def _rest_put_guild_commands(self, call: Any, application_id: int, guild_id: int) -> tuple[int, Any]:
        self._check_application(application_id)
        self._check_guild(guild_id)
        return 200, self._overwrite(guild_id, call.body)

    def _overwrite(self, guild_id: int | None, body: Any) -> list[JSON]:
        """Bulk overwrite: every command checked first (nothing changes on an error); a kept name keeps its id."""
        if not isinstance(body, list) or len(body) > _MAX_COMMANDS:
            raise self._api_error(*_form_error({"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                                                             "message": f"Must be {_MAX_COMMANDS} or fewer."}]}))
        errors: JSON = {}
        names: set[tuple[int, str]] = set()
        for n, command in enumerate(body):
            problems = self._command_problems(command)
            key = (command.get("type", 1), command.get("name")) if isinstance(command, dict) else (0, "")
            if not problems and key in names:
                problems["name"] = _error("APPLICATION_COMMANDS_DUPLICATE_NAME",
                                          "Application command names must be unique")
            names.add(key)
            if problems:
                errors[str(n)] = problems
        if errors:
            raise self._api_error(*_form_error(errors))
        old = self._commands.get(guild_id, {})
        new: dict[str, JSON] = {}
        for command in body:
            kept = old.get(command["name"])
            entry: JSON = {
                "id": kept["id"] if kept else str(self._new_id()), "application_id": self.bot_user["id"],
                "version": str(next(self._command_versions)), "type": command.get("type", 1),
                "name": command["name"], "description": command.get("description", ""),
                "options": command.get("options", []), "default_member_permissions":
                command.get("default_member_permissions"), "dm_permission": command.get("dm_permission", True),
                "nsfw": bool(command.get("nsfw", False)), "contexts": command.get("contexts"),
                "integration_types": command.get("integration_types") or [0],
            }
            if guild_id is not None:
                entry["guild_id"] = str(guild_id)
            new[command["name"]] = entry
        self._commands[guild_id] = new
        self._changed()
        return list(new.values())

    @staticmethod
    def _command_problems(command: Any) -> JSON:
        if not isinstance(command, dict):
            return {"_errors": [{"code": "MODEL_TYPE_CONVERT", "message": "Only dictionaries may be used"}]}
        problems: JSON = {}
        if problem := _name_problem(command.get("name")):
            problems["name"] = _error("APPLICATION_COMMAND_INVALID_NAME", problem)
        if command.get("type", 1) == 1 and (problem := _description_problem(command.get("description"))):
            problems["description"] = _error("BASE_TYPE_BAD_LENGTH", problem)
        options = command.get("options") or []
        if not isinstance(options, list) or len(options) > _MAX_OPTIONS:
            problems["options"] = _error("BASE_TYPE_MAX_LENGTH", f"Must be {_MAX_OPTIONS} or fewer in length.")
            return problems
        for n, option in enumerate(options):
            option = option if isinstance(option, dict) else {}
            if problem := _name_problem(option.get("name")):
                problems[f"options.{n}.name"] = _error("APPLICATION_COMMAND_INVALID_NAME", problem)
            if problem := _description_problem(option.get("description")):
                problems[f"options.{n}.description"] = _error("BASE_TYPE_BAD_LENGTH", problem)
            if option.get("type") not in range(1, 12):
                problems[f"options.{n}.type"] = _error("BASE_TYPE_CHOICES", "Value must be one of 1-11.")
        return problems


@dataclass(slots=True, frozen=True)
class _Body:
    """A request body handed on to another route's handler (which reads only ``body`` and ``query``)."""

    body: JSON
    query: Mapping[str, str]
