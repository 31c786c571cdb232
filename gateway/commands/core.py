"""The everyday commands: help, new conversation, stop, status, tools, whoami, pairing, cron, tool progress, MCP."""

from __future__ import annotations

import functools

from gateway.approvals import end_conversation
from gateway.commands.background import background_tasks, stop_background
from gateway.commands.base import ALIASES, COMMANDS, CommandContext, command
from gateway.commands.permissions import admin_only, enabled
from gateway.session_settings import clear_title
from gateway.store import bump_epoch


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
    ctx.effects += [functools.partial(bump_epoch, key=ctx.session_key),
                    functools.partial(clear_title, key=ctx.session_key),
                    functools.partial(end_conversation, key=ctx.session_key)]
    return "Started a new conversation. Earlier messages are forgotten."


@command("stop", "cancel the running reply (/stop ID: a background task)")
async def _stop(ctx: CommandContext) -> str:
    if task := ctx.args.strip():
        return await stop_background(ctx, task)
    return "Stopped the current run." if await ctx.host.stop_session(ctx.session_key) else "Nothing is running."


@command("status", "model, queue and uptime")
async def _status(ctx: CommandContext) -> str:
    s = ctx.host.session_status(ctx.session_key)
    chosen = await ctx.host.settings.session(ctx.session_key)
    title = f"\nTitle: {chosen.title}" if chosen.title else ""
    tasks = await background_tasks(ctx)
    return (f"Model: {ctx.host.model_for(chosen.model)}{title}\nSession: {ctx.session_key}"
            f"\nRunning: {'yes' if s['busy'] else 'no'}\nQueued: {s['queued']}{tasks}\nUptime: {s['uptime']}")


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


@command("reload-mcp", "admins: reconnect the MCP servers and re-list their tools", aliases=("reload_mcp",),
         admin_only=True)
async def _reload_mcp(ctx: CommandContext) -> str:
    return ctx.host.mcp.reload() if ctx.host.mcp is not None else "No MCP servers are configured."
