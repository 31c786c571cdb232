"""The ``messaging`` section: the chats ``send_message`` may address besides a user's own (gateway/messaging.py)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field

from gateway.config.base import _CHAT_PLATFORMS, _PLATFORM_NAME, _platform_shaped, _Section
from gateway.config.errors import _invalid

# What send_message calls a user's own chats: a configured target may not take these names.
RESERVED_TARGETS = ("home", "dm")
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_CALLER_PLATFORMS = (*_CHAT_PLATFORMS, "webhook")
"""Whose runs may send: the chat platforms and webhook routes (plugins' platforms are checked with the whole
config, ``Config._known_platforms``)."""


def _check_target_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise _invalid(f"invalid target name {value!r}",
                       "use up to 64 lowercase letters, digits, - and _, starting with a letter or digit")
    if value in RESERVED_TARGETS:
        raise _invalid(f"target name {value!r} is reserved",
                       "home is the user's /sethome chat and dm their direct chat; choose another name")
    return value


def _check_user(value: str) -> str:
    platform, sep, user = value.partition(":")
    if value != "*" and (not sep or not user or not _PLATFORM_NAME.fullmatch(platform)):
        raise _invalid(f"invalid user {value!r}",
                       f"write <platform>:<user_id> (platform one of {', '.join(_CALLER_PLATFORMS)} or a plugin's; "
                       "webhook:<route> for a webhook route's runs), or * for every user")
    return value


class MessageTarget(_Section):
    """A chat ``send_message`` may post to: who may use it besides the admins (``users``)."""

    # Chat and thread ids are often written unquoted in YAML.
    model_config = ConfigDict(coerce_numbers_to_str=True)

    platform: Annotated[str, AfterValidator(_platform_shaped)]  # a chat platform or a plugin's (whole config)
    chat_id: Annotated[str, Field(min_length=1)]
    thread_id: str | None = None
    # What the chat is, for the model choosing where to send (shown by send_message's list).
    description: str = ""
    # User keys (telegram:123) that may send here besides auth.admins; * for every user.
    users: list[Annotated[str, AfterValidator(_check_user)]] = Field(default_factory=list)


class MessagingSettings(_Section):
    """``send_message``: configured targets, and whether runs nobody is chatting in may send at all."""

    targets: dict[Annotated[str, AfterValidator(_check_target_name)], MessageTarget] = Field(default_factory=dict)
    # Scheduled runs and webhook runs never send unless allowed here (and their toolsets include messaging).
    allow_cron: bool = False
    allow_webhooks: bool = False
