"""What each chat platform accepts as a bot's reaction on a message. Stdlib only: the config validates with it
(without importing the platforms' libraries) and the simulators enforce it.
"""

from __future__ import annotations

import re

# The Bot API's ReactionTypeEmoji values (python-telegram-bot's ``telegram.constants.ReactionEmoji``): a bot may
# react with these only, one at a time.
TELEGRAM_REACTION_EMOJI = frozenset({
    "👍", "👎", "❤", "🔥", "🥰", "👏", "😁", "🤔", "🤯", "😱", "🤬", "😢", "🎉", "🤩", "🤮", "💩", "🙏", "👌", "🕊",
    "🤡", "🥱", "🥴", "😍", "🐳", "❤\ufe0f\u200d🔥", "🌚", "🌭", "💯", "🤣", "⚡", "🍌", "🏆", "💔", "🤨", "😐",
    "🍓", "🍾", "💋", "🖕", "😈", "😴", "😭", "🤓", "👻", "👨\u200d💻", "👀", "🎃", "🙈", "😇", "😨", "🤝", "✍",
    "🤗", "🫡", "🎅", "🎄", "☃", "💅", "🤪", "🗿", "🆒", "💘", "🙉", "🦄", "😘", "💊", "🙊", "😎", "👾",
    "🤷\u200d♂\ufe0f", "🤷", "🤷\u200d♀\ufe0f", "😡",
})
# Slack names emoji (``eyes``, ``white_check_mark``, ``+1``, ``thumbsup::skin-tone-2``), without the colons.
SLACK_EMOJI_NAME = re.compile(r"[a-z0-9_+'-]{1,100}(::skin-tone-[2-6])?")
# Discord takes a Unicode emoji, or a custom one as ``name:id`` (``<:name:id>`` as written in messages).
DISCORD_CUSTOM_EMOJI = re.compile(r"<?a?:?[A-Za-z0-9_]{2,32}:\d{15,21}>?")
_ASCII_WORD = re.compile(r"[\sA-Za-z0-9]")


def reaction_problem(platform: str, emoji: str) -> str | None:
    """Why ``platform`` would refuse ``emoji`` as a bot's reaction; None when it is acceptable (or the platform
    has no rule)."""
    if platform == "telegram" and emoji not in TELEGRAM_REACTION_EMOJI:
        return f"{emoji!r} is not one of Telegram's reaction emoji ({' '.join(sorted(TELEGRAM_REACTION_EMOJI))})"
    if platform == "slack" and not SLACK_EMOJI_NAME.fullmatch(emoji):
        return f"{emoji!r} is not a Slack emoji name (write it without colons, e.g. white_check_mark)"
    if platform == "discord" and not DISCORD_CUSTOM_EMOJI.fullmatch(emoji) and _ASCII_WORD.search(emoji):
        return f"{emoji!r} is neither a Unicode emoji nor a custom emoji (name:id)"
    return None
