"""The everyday commands: help, new conversation, stop, status, tools, whoami, pairing, cron, tool progress, MCP."""

from __future__ import annotations

from gateway.commands.base import ALIASES, COMMANDS, CommandContext, command
from gateway.commands.permissions import admin_only, enabled
from gateway.tool_progress import MODES, chat_modes, mode_for


@command("help", "show this help")
async def _help(ctx: CommandContext) -> str:
    e = ctx.event
    admin = ctx.host.is_admin(e.platform, e.user_id)
    lines = ["Commands:"]
    lines += [f"/{name} - {entry.description}" for name, entry in sorted(COMMANDS.items())
              if name not in ALIASES and enabled(ctx.host.cfg, name) and (admin or not admin_only(ctx.host.cfg, name))]
    lines.append("Anything else is sent to the assistant.")
    return "\n".join(lines)


@command("new", "start a new conversation", aliases=("reset",))
async def _new(ctx: CommandContext) -> str:
    await ctx.host.reset_session(ctx.session_key)
    return "Started a new conversation. Earlier messages are forgotten."


@command("stop", "cancel the running reply")
async def _stop(ctx: CommandContext) -> str:
    return "Stopped the current run." if await ctx.host.stop_session(ctx.session_key) else "Nothing is running."


@command("status", "model, queue and uptime")
async def _status(ctx: CommandContext) -> str:
    s = ctx.host.session_status(ctx.session_key)
    return (f"Model: {s['model']}\nSession: {ctx.session_key}\nRunning: {'yes' if s['busy'] else 'no'}"
            f"\nQueued: {s['queued']}\nUptime: {s['uptime']}")


@command("model", "show the model")
async def _model(ctx: CommandContext) -> str:
    current = ctx.host.session_status(ctx.session_key)["model"]
    if ctx.args.strip():
        return f"Model: {current}. Changing the model from chat is not enabled on this gateway."
    return f"Model: {current}"


@command("tools", "list the tools available here")
async def _tools(ctx: CommandContext) -> str:
    tools = ctx.host.session_tools(ctx.session_key, ctx.event.platform)
    return "Tools available here: " + (", ".join(tools) if tools else "none")


@command("whoami", "your ids as the gateway sees them")
async def _whoami(ctx: CommandContext) -> str:
    e = ctx.event
    return (f"Platform: {e.platform}\nUser: {e.user_id} ({e.user_name})\nChat: {e.chat_id} ({e.chat_type})"
            + (f"\nThread: {e.thread_id}" if e.thread_id else ""))


@command("pair", "admins: approve a pairing code (/pair approve CODE)")
async def _pair(ctx: CommandContext) -> str:
    action, _, code = ctx.args.partition(" ")
    if action != "approve" or not code.strip():
        return "Usage: /pair approve CODE"
    return await ctx.host.approve_pairing(ctx.event, code.strip())


_CRON_USAGE = "Usage: /cron list | /cron pause ID | /cron resume ID | /cron remove ID | /cron run ID"


@command("cron", "your scheduled jobs (/cron list|pause|resume|remove|run ID)")
async def _cron(ctx: CommandContext) -> str:
    cron = ctx.host.cron
    if cron is None:
        return "Scheduled jobs are not available on this gateway."
    e = ctx.event
    actor = None if ctx.host.is_admin(e.platform, e.user_id) else f"{e.platform}:{e.user_id}"
    action, _, job_id = ctx.args.partition(" ")
    action, job_id = action.lower() or "list", job_id.strip()
    if action == "list":
        jobs = await cron.list_jobs(actor)
        if not jobs:
            return "No scheduled jobs. Ask me to schedule something, e.g. 'every weekday at 9:00, summarize the news'."
        return "\n".join(["Scheduled jobs:", *(j.summary() for j in jobs)])
    if action not in ("pause", "resume", "remove", "run") or not job_id:
        return _CRON_USAGE
    missing = f"No job {job_id!r}. /cron list shows your jobs."
    if action == "remove":
        return f"Removed job {job_id}." if await cron.remove(job_id, actor) else missing
    if action == "run":
        return f"Running job {job_id} now." if await cron.run_now(job_id, actor) else missing
    job = await (cron.pause if action == "pause" else cron.resume)(job_id, actor)
    return missing if job is None else f"{action.capitalize()}d: {job.summary()}"


_MODE_HELP = {
    "off": "no tool progress",
    "new": "a line when the assistant starts using another tool",
    "all": "a line for every tool call",
    "verbose": "every tool call with its full arguments",
}


@command("verbose", "tool progress in this chat: off, new, all or verbose (without a mode: the next one)")
async def _verbose(ctx: CommandContext) -> str:
    e = ctx.event
    wanted = ctx.args.strip().lower()
    if wanted and wanted not in MODES:
        return "Usage: /verbose [" + "|".join(MODES) + "] (without a mode: the next one)"
    current = mode_for(ctx.host.cfg, e.platform, e.chat_id)
    mode = MODES[MODES.index(wanted) if wanted else (MODES.index(current) + 1) % len(MODES)]
    chat_modes.set(e.platform, e.chat_id, mode)
    return f"Tool progress here: {mode} ({_MODE_HELP[mode]})."


@command("reload-mcp", "admins: reconnect the MCP servers and re-list their tools", aliases=("reload_mcp",),
         admin_only=True)
async def _reload_mcp(ctx: CommandContext) -> str:
    return ctx.host.mcp.reload() if ctx.host.mcp is not None else "No MCP servers are configured."
