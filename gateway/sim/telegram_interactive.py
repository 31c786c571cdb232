"""The interactive part of the Telegram Bot API simulator: inline keyboards, button presses (callback queries)
and the bot's command menus.

``TelegramSimulator`` owns one ``InteractiveApi`` (``sim.interactive``), registers its methods
(answerCallbackQuery, setMyCommands, getMyCommands, deleteMyCommands) and validates every inline keyboard a
message carries with ``check_inline_keyboard``. Its drivers (``user_clicks``, ``user_presses``) build the
``callback_query`` updates here and deliver them like any other update (getUpdates or the webhook).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["ApiCall", "InteractiveApi", "Refused", "button_data", "check_inline_keyboard", "keyboard_of",
           "scope_key"]

JSON = dict[str, Any]

MAX_CALLBACK_DATA_BYTES = 64
MAX_BUTTONS = 100
MAX_ANSWER_TEXT = 200
MAX_COMMANDS = 100
MAX_DESCRIPTION = 256
_COMMAND_NAME = re.compile(r"[a-z0-9_]{1,32}")
_LANGUAGE_CODE = re.compile(r"[a-z]{2}")
# An inline button has exactly one of these besides its text.
_BUTTON_ACTIONS = frozenset({"url", "callback_data", "web_app", "login_url", "switch_inline_query",
                             "switch_inline_query_current_chat", "switch_inline_query_chosen_chat", "copy_text",
                             "callback_game", "pay"})
_SCOPES_WITH_CHAT = frozenset({"chat", "chat_administrators", "chat_member"})
_SCOPES = frozenset({"default", "all_private_chats", "all_group_chats", "all_chat_administrators"}) | _SCOPES_WITH_CHAT
_QUERY_INVALID = "Bad Request: query is too old and response timeout expired or query ID is invalid"


class Refused(Exception):
    """A call the Bot API answers with 400 and ``description`` (``Bad Request: ...``)."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class ApiCall(Protocol):
    """A recorded request: the decoded parameters are all this module reads."""

    params: JSON


def check_inline_keyboard(markup: JSON) -> None:
    """Refuse an ``inline_keyboard`` as Telegram does: rows of buttons, each with a text and one action, and
    ``callback_data`` of 1-64 bytes."""
    rows = markup.get("inline_keyboard")
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise Refused("Bad Request: can't parse inline keyboard button: InlineKeyboardButton must be an Object")
    buttons = [button for row in rows for button in row]
    if len(buttons) > MAX_BUTTONS:
        raise Refused("Bad Request: reply markup is too long")
    for button in buttons:
        if not isinstance(button, dict) or not str(button.get("text") or "").strip():
            raise Refused("Bad Request: BUTTON_TEXT_INVALID")
        if len(_BUTTON_ACTIONS.intersection(button)) != 1:
            raise Refused("Bad Request: can't parse inline keyboard button: Text buttons are unallowed in the "
                          "inline keyboard")
        data = button.get("callback_data")
        if data is not None and not 1 <= len(str(data).encode()) <= MAX_CALLBACK_DATA_BYTES:
            raise Refused("Bad Request: BUTTON_DATA_INVALID")


def keyboard_of(message: JSON | None) -> list[list[JSON]]:
    """The inline keyboard a message shows now, row by row ([] when it has none)."""
    markup = (message or {}).get("reply_markup") or {}
    return [list(row) for row in markup.get("inline_keyboard", [])]


def button_data(message: JSON, label: str) -> str:
    """The ``callback_data`` of the button labelled ``label`` on ``message``; ValueError when there is none."""
    for row in keyboard_of(message):
        for button in row:
            if button.get("text") == label and "callback_data" in button:
                return str(button["callback_data"])
    raise ValueError(f"message {message.get('message_id')} has no callback button labelled {label!r}")


def scope_key(scope: JSON | str | None = None, language_code: str = "") -> str:
    """The key of one command list in ``InteractiveApi.commands``: the scope (a BotCommandScope object or just
    its type) and the language code."""
    normalized = {"type": scope} if isinstance(scope, str) else dict(scope or {"type": "default"})
    return f"{json.dumps(normalized, sort_keys=True)}|{language_code}"


class InteractiveApi:
    """Callback queries and command menus: what the bot answered and what menu each scope shows."""

    def __init__(self, bot_id: int) -> None:
        self.bot_id = bot_id
        self._seq = 0
        self._open: set[str] = set()
        self._answers: list[ApiCall] = []
        self._commands: dict[str, list[JSON]] = {}

    def handlers(self) -> dict[str, Callable[[ApiCall], Awaitable[Any]]]:
        """The Bot API methods this part serves, by name."""
        return {"answerCallbackQuery": self._answer_callback_query, "setMyCommands": self._set_my_commands,
                "getMyCommands": self._get_my_commands, "deleteMyCommands": self._delete_my_commands}

    # -- readers -------------------------------------------------------------------------------------

    @property
    def answers(self) -> list[ApiCall]:
        """Successful answerCallbackQuery calls, in order (``params``: callback_query_id, text, show_alert ...)."""
        return list(self._answers)

    def answer_to(self, query_id: str) -> ApiCall | None:
        """The answer given to one callback query, if any."""
        return next((a for a in self._answers if str(a.params.get("callback_query_id")) == query_id), None)

    @property
    def open_queries(self) -> set[str]:
        """Callback query ids not answered yet."""
        return set(self._open)

    @property
    def commands(self) -> dict[str, list[JSON]]:
        """Every command list set, keyed by ``scope_key``."""
        return dict(self._commands)

    def commands_for(self, scope: JSON | str | None = None, language_code: str = "") -> list[JSON]:
        """The command list set for exactly this scope and language ([] when none)."""
        return list(self._commands.get(scope_key(scope, language_code), []))

    # -- driver --------------------------------------------------------------------------------------

    def callback_query(self, message: JSON, user: JSON, data: str, *, inaccessible: bool = False) -> JSON:
        """A ``callback_query`` for ``user`` pressing the button carrying ``data`` on ``message`` (a message the bot
        sent). ``inaccessible``: the query carries only the message's chat and id (date 0), as for a message too
        old for the bot to see. ValueError when the message has no such button."""
        if message["from"]["id"] != self.bot_id:
            raise ValueError(f"message {message['message_id']} was not sent by the bot")
        carried = [b.get("callback_data") for row in keyboard_of(message) for b in row]
        if data not in carried:
            raise ValueError(f"message {message['message_id']} has no button with callback_data {data!r} "
                             f"(it has {carried})")
        self._seq += 1
        query_id = f"{self.bot_id}{self._seq:06d}"
        self._open.add(query_id)
        chat = message["chat"]
        shown = ({"chat": dict(chat), "message_id": message["message_id"], "date": 0} if inaccessible
                 else json.loads(json.dumps(message)))
        return {"id": query_id, "from": dict(user), "message": shown, "chat_instance": str(chat["id"]),
                "data": data}

    # -- methods -------------------------------------------------------------------------------------

    async def _answer_callback_query(self, call: ApiCall) -> bool:
        query_id = str(call.params.get("callback_query_id") or "")
        if query_id not in self._open:
            raise Refused(_QUERY_INVALID)
        if len(str(call.params.get("text") or "")) > MAX_ANSWER_TEXT:
            raise Refused("Bad Request: MESSAGE_TOO_LONG")
        self._open.discard(query_id)
        self._answers.append(call)
        return True

    @staticmethod
    def _key(params: JSON) -> str:
        scope = params.get("scope")
        if scope is not None:
            if not isinstance(scope, dict) or scope.get("type") not in _SCOPES:
                raise Refused("Bad Request: can't parse BotCommandScope JSON object")
            if scope["type"] in _SCOPES_WITH_CHAT and scope.get("chat_id") in (None, ""):
                raise Refused("Bad Request: chat_id is empty")
        language = str(params.get("language_code") or "")
        if language and not _LANGUAGE_CODE.fullmatch(language):
            raise Refused("Bad Request: invalid language code specified")
        return scope_key(scope, language)

    async def _set_my_commands(self, call: ApiCall) -> bool:
        commands = call.params.get("commands")
        if not isinstance(commands, list):
            raise Refused("Bad Request: can't parse commands JSON object")
        if len(commands) > MAX_COMMANDS:
            raise Refused("Bad Request: BOT_COMMANDS_TOO_MUCH")
        for cmd in commands:
            if not (isinstance(cmd, dict) and _COMMAND_NAME.fullmatch(str(cmd.get("command", "")))):
                raise Refused("Bad Request: BOT_COMMAND_INVALID")
            if not 1 <= len(str(cmd.get("description", "")).strip()) <= MAX_DESCRIPTION:
                raise Refused("Bad Request: BOT_COMMAND_DESCRIPTION_INVALID")
        key = self._key(call.params)
        if commands:
            self._commands[key] = [{"command": c["command"], "description": c["description"]} for c in commands]
        else:  # an empty list deletes the scope's commands
            self._commands.pop(key, None)
        return True

    async def _get_my_commands(self, call: ApiCall) -> list[JSON]:
        return self._commands.get(self._key(call.params), [])

    async def _delete_my_commands(self, call: ApiCall) -> bool:
        self._commands.pop(self._key(call.params), None)
        return True
