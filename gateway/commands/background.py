"""Detached runs in a chat (``/background PROMPT``), stopped by their id (``/stop ID``)."""

from __future__ import annotations

import re

from gateway.commands.base import CommandContext, command
from gateway.session import background_session_key

_TASK_ID = re.compile(r"[0-9a-f]{6}")
USAGE = ("Usage: /background PROMPT - runs the prompt as a separate task, without this conversation's history. "
         "You can keep chatting; its answer comes here when it is done.")


@command("background", "run a prompt as a separate task; its answer comes here when done (/background PROMPT)")
async def _background(ctx: CommandContext) -> str:
    prompt = ctx.args.strip()
    if not prompt:
        return USAGE
    task = ctx.host.start_background(ctx, prompt)
    return f"Background task {task} started. Keep chatting; its answer will come here. /stop {task} cancels it."


async def background_tasks(ctx: CommandContext) -> str:
    """For ``/status``: a line naming the chat's unfinished background tasks, or nothing when there are none."""
    tasks = await ctx.host.store.unfinished_background(background_session_key(ctx.session_key, ""))
    states = {"pending": "waiting", "running": "running"}
    return "\nBackground: " + ", ".join(f"{task} ({states[status]})" for task, status in tasks) if tasks else ""


async def stop_background(ctx: CommandContext, task: str) -> str:
    """``/stop ID``: cancel the chat's background task ``task`` (running, or accepted and not started yet)."""
    task = task.lower()
    if _TASK_ID.fullmatch(task) and await ctx.host.stop_session(background_session_key(ctx.session_key, task)):
        return f"Stopped background task {task}."
    return f"No background task {task} is running here."
