"""Working on the conversation itself: run the last message again (/retry), take back the last exchange
(/undo), summarise it now (/compress), name it (/title)."""

from __future__ import annotations

import functools

from gateway.commands.base import CommandContext, command
from gateway.store import drop_messages_from

TITLE_CHARS = 120
QUOTE_CHARS = 80
_BUSY = "A reply is still being written. Wait for it, or /stop it first."


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return f"“{text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS - 1] + '…'}”"


async def _take_back(ctx: CommandContext) -> str | None:
    """Drop the conversation's last exchange (its last user message and everything after it) together with the
    command's reply; the user's text, or None when there is nothing to take back."""
    last = await ctx.host.store.last_user_message(ctx.session_key)
    if last is None:
        return None
    epoch, first_id, text = last
    ctx.effects.append(functools.partial(drop_messages_from, key=ctx.session_key, epoch=epoch, first_id=first_id))
    return text


@command("retry", "send your last message again (its previous answer is dropped)")
async def _retry(ctx: CommandContext) -> str:
    if await ctx.host.session_busy(ctx.session_key):
        return _BUSY
    text = await _take_back(ctx)
    if text is None:
        return "Nothing to retry in this conversation yet."
    ctx.host.retry(ctx, text)
    return f"Retrying {_quote(text)}"


@command("undo", "take back your last message and its answer")
async def _undo(ctx: CommandContext) -> str:
    if await ctx.host.session_busy(ctx.session_key):
        return _BUSY
    text = await _take_back(ctx)
    if text is None:
        return "Nothing to undo in this conversation."
    return f"Removed your last message {_quote(text)} and its answer from this conversation."


@command("compress", "summarise the earlier conversation now, to make room", slow=True)
async def _compress(ctx: CommandContext) -> str:
    if await ctx.host.session_busy(ctx.session_key):
        return _BUSY
    prepared = await ctx.host.compress_session(ctx.session_key, ctx.event)
    if prepared is None:
        return "Compression is off on this gateway (its operator sets model.context_tokens to turn it on)."
    if not prepared.compressed and prepared.model_calls:
        return "The model could not write a summary just now; the conversation is unchanged. Try again later."
    if not prepared.compressed:
        return "Nothing to compress yet: the conversation is only its most recent turns."
    return (f"Compressed the earlier conversation into a summary; the next request starts from it and the "
            f"{len(prepared.messages) - 1} most recent messages.")


@command("title", "show or set this conversation's title (/title TEXT)")
async def _title(ctx: CommandContext) -> str:
    title = " ".join(ctx.args.split())
    if not title:
        current = (await ctx.host.settings.session(ctx.session_key)).title
        return f"Title: {current}" if current else "This conversation has no title. Set one with /title TEXT."
    if len(title) > TITLE_CHARS:
        return f"A title has at most {TITLE_CHARS} characters."
    await ctx.host.settings.set_session(ctx.session_key, title=title)
    return f"Title: {title}"
