"""A chat's own choices, stored with its session: the model (/model), tool progress (/verbose), spoken answers
(/voice), and its user's home channel (/sethome)."""

from __future__ import annotations

from gateway.commands.base import CommandContext, command
from gateway.session_settings import HomeChannel
from gateway.tool_progress import MODES, mode_for

_DEFAULT = ("default", "reset")


@command("model", "show the model, list the others and switch this conversation to one (/model NAME)")
async def _model(ctx: CommandContext) -> str:
    cfg = ctx.host.cfg.model
    chosen = (await ctx.host.settings.session(ctx.session_key)).model
    current = ctx.host.model_for(chosen)
    wanted = ctx.args.strip()
    choices = [cfg.name, *(m for m in cfg.allowed if m != cfg.name)]
    if not wanted:
        listing = ("\nAvailable: " + ", ".join(f"{m} (default)" if m == cfg.name else m for m in choices)
                   + "\nSwitch with /model NAME; /model default goes back.") if cfg.allowed else ""
        return f"Model: {current}{listing}"
    if not cfg.allowed:
        return (f"Model: {current}. Switching models is not enabled on this gateway "
                "(its operator lists the models a chat may use in model.allowed).")
    if wanted.lower() in _DEFAULT:
        wanted = cfg.name
    if wanted not in choices:
        return f"Unknown model {wanted!r}. Available: {', '.join(choices)}."
    await ctx.host.settings.set_session(ctx.session_key, model=None if wanted == cfg.name else wanted)
    return f"Model for this conversation: {wanted}."


_MODE_HELP = {
    "off": "no tool progress",
    "new": "a line when the assistant starts using another tool",
    "all": "a line for every tool call",
    "verbose": "every tool call with its full arguments",
}


@command("verbose", "tool progress in this chat: off, new, all or verbose (without a mode: the next one)")
async def _verbose(ctx: CommandContext) -> str:
    wanted = ctx.args.strip().lower()
    if wanted and wanted not in MODES:
        return "Usage: /verbose [" + "|".join(MODES) + "] (without a mode: the next one)"
    chosen = (await ctx.host.settings.session(ctx.session_key)).verbose
    current = mode_for(ctx.host.cfg, ctx.event.platform, chosen)
    mode = MODES[MODES.index(wanted) if wanted else (MODES.index(current) + 1) % len(MODES)]
    await ctx.host.settings.set_session(ctx.session_key, verbose=mode)
    return f"Tool progress here: {mode} ({_MODE_HELP[mode]})."


@command("voice", "spoken answers in this chat: on or off (without an argument: switch)")
async def _voice(ctx: CommandContext) -> str:
    wanted = ctx.args.strip().lower()
    if wanted not in ("", "on", "off"):
        return "Usage: /voice [on|off] (without an argument: switch)"
    speech = ctx.host.cfg.media.speech
    if speech is None and wanted != "off":
        return "Voice answers are not configured here: the operator sets media.speech in the gateway's config."
    current = (await ctx.host.settings.session(ctx.session_key)).voice == "on"
    voice = wanted == "on" if wanted else not current
    await ctx.host.settings.set_session(ctx.session_key, voice="on" if voice else None)
    if not voice:
        return "Voice answers off: answers come as text only."
    limit = speech.max_chars if speech is not None else 0
    return f"Voice answers on: each answer also comes as a voice message (answers up to {limit} characters)."


@command("sethome", "make this chat your home channel: scheduled jobs and notices without a target come here")
async def _sethome(ctx: CommandContext) -> str:
    e = ctx.event
    await ctx.host.settings.set_home(f"{e.platform}:{e.user_id}", HomeChannel(e.platform, e.chat_id, e.thread_id))
    return ("This chat is now your home channel: scheduled jobs created with deliver 'home', and notices about "
            "your jobs, come here.")
