"""What a chat message does while its session's run goes on (``/busy``), chosen per session."""

from __future__ import annotations

from gateway.commands.base import CommandContext, command

MODES = {
    "queue": "a message sent while I'm answering waits, and gets its own answer after the current one",
    "interrupt": "a message sent while I'm answering stops the current answer and is answered instead",
    "steer": "a message sent while I'm answering joins it: I read it before my next step and answer both together",
}


@command("busy", "what a message does while I'm answering: queue, interrupt or steer")
async def _busy(ctx: CommandContext) -> str:
    wanted = ctx.args.strip().lower()
    if wanted:
        if wanted not in MODES:
            return "Usage: /busy [" + "|".join(MODES) + "]"
        await ctx.host.settings.set_session(ctx.session_key, busy=wanted)
        return f"Busy mode here: {wanted} ({MODES[wanted]})."
    current = (await ctx.host.settings.session(ctx.session_key)).busy or ctx.host.cfg.gateway.busy
    lines = [f"Busy mode here: {current}.", *(f"{mode} - {what}" for mode, what in MODES.items()),
             "Change it with /busy " + "|".join(MODES) + "."]
    return "\n".join(lines)
