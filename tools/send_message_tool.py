"""The ``send_message`` tool: post a message to another chat the user may address.

Which chats those are is the gateway's business (``MessagingBackend``): the user's home channel, their direct chat
with the bot, and the targets the operator configured for them. The model names a target, never a raw chat id.
A send goes through the gateway's outbox, once per run whatever the retries; without a backend the tool is
unavailable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tools.registry import EFFECT_SENDS_MESSAGES, ISOLATION_PROCESS, BackendSlot, registry, tool_error, tool_result

MAX_MESSAGE_CHARS = 8_000
ACTIONS = ("send", "list")


class MessagingError(Exception):
    """A send or listing refused; the message says why and what to do instead."""


@dataclass(slots=True, frozen=True)
class Sender:
    """Who is sending, from the tool context: the user, the run (its id keys the send's idempotency) and where
    the run came from (a chat platform, or ``cron`` / ``webhook`` for runs nobody is chatting in)."""

    user_key: str
    run_id: str
    source: str


@dataclass(slots=True, frozen=True)
class MessageTarget:
    """A chat the sender may address: ``name`` is what the model passes (home, dm or a configured name)."""

    name: str
    platform: str
    chat_id: str
    thread_id: str | None
    description: str


@dataclass(slots=True, frozen=True)
class SentMessage:
    """A send stored for delivery: in ``parts`` messages; ``repeated`` when this run had already sent it."""

    target: MessageTarget
    parts: int
    repeated: bool


class MessagingBackend(Protocol):
    """Targets and sends for a sender; called from worker threads, so it must be thread-safe."""

    def targets(self, sender: Sender) -> list[MessageTarget]:
        """The chats ``sender`` may address now; raises ``MessagingError`` when it may send nowhere."""
        ...

    def send(self, sender: Sender, target: str, text: str) -> SentMessage:
        """Send ``text`` to the target named ``target``; raises ``MessagingError`` when refused."""
        ...


_slot: BackendSlot[MessagingBackend | None] = BackendSlot(None)
# Send through ``backend`` (the gateway plugs its outbox in here); None makes the tool unavailable.
set_messaging_backend = _slot.set



def _described(target: MessageTarget) -> dict[str, str]:
    return {"target": target.name, "platform": target.platform, "description": target.description}


def _send(backend: MessagingBackend, sender: Sender, args: dict[str, Any]) -> str:
    target, text = args.get("target"), args.get("message")
    if not isinstance(target, str) or not target.strip():
        return tool_error("send needs 'target': home, dm or a name shown by the list action.")
    if not isinstance(text, str) or not text.strip():
        return tool_error("send needs 'message': the text to send.")
    if len(text) > MAX_MESSAGE_CHARS:
        return tool_error(f"The message is {len(text)} characters; the limit is {MAX_MESSAGE_CHARS}. Shorten it.")
    sent = backend.send(sender, target.strip().lower(), text.strip())
    return tool_result(sent=_described(sent.target), parts=sent.parts, **(
        {"note": "This run had already sent this message there; it was not sent again."} if sent.repeated else {}))


def _send_message(args: dict[str, Any], **ctx: Any) -> str:
    """Handler of the ``send_message`` tool."""
    backend, user_key, run_id = _slot.get(), ctx.get("user_key"), ctx.get("run_id")
    if backend is None or not user_key or not run_id:
        return tool_error("Sending messages is unavailable here: there is no user, run or outbox.")
    sender = Sender(str(user_key), str(run_id), str(ctx.get("platform") or ""))
    action = args.get("action") or "send"
    try:
        if action == "list":
            return tool_result(targets=[_described(t) for t in backend.targets(sender)])
        if action == "send":
            return _send(backend, sender, args)
    except MessagingError as exc:
        return tool_error(str(exc))
    return tool_error(f"Unknown action {action!r}; use one of: {', '.join(ACTIONS)}.")


registry.register(
    name="send_message",
    toolset="messaging",
    schema={
        "name": "send_message",
        "description": (
            "Send a message to another chat the user may address: 'home' (the chat they made their home channel "
            "with /sethome), 'dm' (their direct chat with you) or a target the operator configured. Use list to "
            "see the targets available, then send with target and message. The message goes out as written, "
            "once; your answer here still goes to this chat."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": list(ACTIONS), "description": "send, or list the targets."},
                "target": {"type": "string", "description": "send: home, dm or a target name from list."},
                "message": {"type": "string", "description": f"send: the text (at most {MAX_MESSAGE_CHARS} "
                                                             "characters; long ones go out in parts)."},
            },
            "required": ["action"],
        },
    },
    handler=_send_message,
    check_fn=_slot.installed,
    isolation=ISOLATION_PROCESS,  # the gateway's own outbox
    effects=[EFFECT_SENDS_MESSAGES],
    emoji="📨",
)
