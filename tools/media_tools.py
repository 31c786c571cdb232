"""Media tools: ``send_file`` (a workspace file goes to the chat with the answer) and ``vision_analyze`` (look at an
image in the workspace).

Neither moves bytes through its result: ``send_file`` checks the file and returns an ``attach`` request the gateway
reads at the run's end (gateway/media/outbound.py: the file is stored with the answer's outbox parts, so it is
delivered once and in order); ``vision_analyze`` either asks the gateway to show the image to a model that sees
(``show_image``, gateway/agent.py) or has the configured vision model describe it (``set_describer``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from tools.registry import EFFECT_SENDS_MESSAGES, ISOLATION_PROCESS, registry, tool_error, tool_result
from tools.workspace import WorkspaceError, resolve_in_workspace, workspace_root

SEND_AS = ("auto", "photo", "document", "voice", "audio")
MAX_CAPTION_CHARS = 1000
MAX_IMAGE_BYTES = 20 * 1024 * 1024

Describer = Callable[[bytes, str], Awaitable[str]]
"""Describes an image (its bytes) in answer to a question, through the configured vision model."""

_describer: Describer | None = None


def set_describer(describer: Describer | None) -> None:
    """Install (or remove, with None) what ``vision_analyze`` asks when the chat model cannot see images."""
    global _describer
    _describer = describer


def _workspace_file(ctx: Mapping[str, Any], path: Any) -> tuple[Path, str]:
    """The file ``path`` names in the workspace and its path relative to it; raises WorkspaceError."""
    root = workspace_root(ctx)
    target = resolve_in_workspace(root, path)
    if not target.is_file():
        raise WorkspaceError(f"{path} is not a file in the workspace")
    return target, str(target.relative_to(root))


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n >= 1024 * 1024 else f"{n} bytes"


def _send_file(args: dict[str, Any], **ctx: Any) -> str:
    """Handler of ``send_file``."""
    send_as = args.get("as") or "auto"
    caption = args.get("caption") or ""
    if send_as not in SEND_AS:
        return tool_error(f"'as' must be one of {', '.join(SEND_AS)}.")
    if not isinstance(caption, str) or len(caption) > MAX_CAPTION_CHARS:
        return tool_error(f"'caption' must be a string of at most {MAX_CAPTION_CHARS} characters.")
    try:
        target, relative = _workspace_file(ctx, args.get("path"))
    except WorkspaceError as exc:
        return tool_error(str(exc))
    limits: Mapping[str, int] = json.loads(ctx.get("upload_limits") or "{}")
    if not any(limits.values()):
        return tool_error("Files cannot be sent from here: this run has no chat that takes files.")
    size = target.stat().st_size
    limit = max(limits.values()) if send_as == "auto" else limits.get(send_as, 0)
    if size == 0:
        return tool_error(f"{relative} is empty.")
    if size > limit:
        return tool_error(f"{relative} is {_size(size)}; {ctx.get('platform', 'this chat')} takes files of at most "
                          f"{_size(limit)}" + ("" if send_as == "auto" else f" as {send_as}") + ".")
    return tool_result(status="queued", note="The file is sent to the chat right after your answer.",
                       attach={"path": relative, "caption": caption, "as": send_as})


def _field(result: str, name: str) -> Any:
    """``name`` of a tool result's JSON object; None when the result is no such object."""
    try:
        payload = json.loads(result)
    except (TypeError, ValueError):
        return None
    return payload.get(name) if isinstance(payload, dict) else None


def parse_attach(result: str) -> dict[str, str] | None:
    """The ``attach`` request of a ``send_file`` result (path, caption, as); None for any other result."""
    attach = _field(result, "attach")
    if not isinstance(attach, dict) or not all(isinstance(attach.get(k), str) for k in ("path", "caption", "as")):
        return None
    return {k: attach[k] for k in ("path", "caption", "as")}


def parse_show_image(result: str) -> str | None:
    """The workspace path a ``vision_analyze`` result asks the gateway to show the model; None otherwise."""
    path = _field(result, "show_image")
    return path if isinstance(path, str) else None


async def _vision_analyze(args: dict[str, Any], **ctx: Any) -> str:
    """Handler of ``vision_analyze``."""
    question = args.get("question") or "Describe this image in detail."
    if not isinstance(question, str):
        return tool_error("'question' must be a string.")
    try:
        target, relative = _workspace_file(ctx, args.get("path"))
    except WorkspaceError as exc:
        return tool_error(str(exc))
    if target.stat().st_size > MAX_IMAGE_BYTES:
        return tool_error(f"{relative} is over {_size(MAX_IMAGE_BYTES)}; too large to look at.")
    if ctx.get("sees_images"):
        return tool_result(show_image=relative, note="The image follows in the next message; look at it there.")
    if _describer is None:
        return tool_error("No model here can see images: the chat model has no vision and no vision model is "
                          "configured (media.vision).")
    return tool_result(path=relative, description=await _describer(target.read_bytes(), question))


registry.register(
    name="send_file",
    toolset="media",
    schema={
        "name": "send_file",
        "description": (
            "Send a file from the workspace to the user's chat, after your answer: an image is shown as a photo, "
            "other files as attachments. Use it for files you made (charts, reports, exports) or the user asked "
            "for. The chat's size limit is checked now."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The file's path in the workspace."},
                "caption": {"type": "string", "description": "A short caption shown with the file."},
                "as": {"type": "string", "enum": list(SEND_AS),
                       "description": "How to show it; auto: a photo for images, else a document."},
            },
            "required": ["path"],
        },
    },
    handler=_send_file,
    effects=[EFFECT_SENDS_MESSAGES],
    emoji="📎",
)

registry.register(
    name="vision_analyze",
    toolset="media",
    schema={
        "name": "vision_analyze",
        "description": (
            "Look at an image file in the workspace (a photo the user sent is saved there; so are images tools "
            "made) and answer a question about it."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The image's path in the workspace."},
                "question": {"type": "string", "description": "What to find out about the image."},
            },
            "required": ["path"],
        },
    },
    handler=_vision_analyze,
    is_async=True,
    isolation=ISOLATION_PROCESS,  # the vision model's endpoint and key stay in the gateway
    emoji="👁️",
)
