"""The rows and records the store reads and writes (``gateway.store`` re-exports them)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from gateway.shared_limits import UserCharge
from gateway.steering import Steered
from platforms.base import Choice


@dataclass(slots=True)
class InboxRow:
    """An accepted event."""

    id: int
    dedupe_key: str
    platform: str
    kind: str
    session_key: str
    payload: dict[str, Any]
    status: str
    run_id: str | None


@dataclass(slots=True)
class SessionRef:
    """The chat a session belongs to (to create it on first use)."""

    key: str
    platform: str
    chat_id: str
    user_id: str | None
    thread_id: str | None


@dataclass(slots=True)
class Acceptance:
    """The outcome of offering an event to the inbox."""

    inbox_id: int
    run_id: str | None
    duplicate: bool


@dataclass(slots=True)
class RunRow:
    """One agent run (chat, webhook or cron)."""

    id: str
    kind: str
    source: str
    session_key: str
    status: str
    toolsets: list[str]
    prompt: str
    deliver_to: str | None
    result: str | None
    error: str | None
    tool_calls: list[dict[str, Any]]
    model_calls: int
    attempts: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    model_seconds: float | None
    ended_by: str | None = None
    usage: RunUsage | None = None
    """The tokens it used (None until it ended, or when the model server reported none)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form for ``GET /runs/{id}`` and the CLI."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__}
        out["usage"] = dataclasses.asdict(self.usage) if self.usage is not None else None
        if self.started_at is not None and self.finished_at is not None:
            out["duration_seconds"] = round(self.finished_at - self.started_at, 6)
        return out


@dataclass(slots=True)
class NewRun:
    """What is known about a run when its triggering event is accepted."""

    id: str
    kind: str
    source: str
    toolsets: list[str]
    prompt: str
    deliver_to: str | None = None


@dataclass(slots=True)
class ChatMessage:
    """One transcript entry in OpenAI message form."""

    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The message as the chat-completions API expects it."""
        msg: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            msg["tool_call_id"] = self.tool_call_id
        return msg


@dataclass(frozen=True, slots=True)
class FilePart:
    """A file an outbox part sends (the part's text is its caption); ``data`` is set when the part is stored, rows
    read back carry only the description (the sender loads the bytes by ``sha256``)."""

    kind: str
    name: str
    mime_type: str
    size: int
    sha256: str
    data: bytes | None = field(default=None, repr=False)

    def describe(self) -> str:
        """JSON for the outbox's ``file`` column."""
        return json.dumps({"kind": self.kind, "name": self.name, "mime_type": self.mime_type, "size": self.size})

    @classmethod
    def described(cls, text: str, sha256: str) -> FilePart:
        """Inverse of ``describe`` (without the bytes)."""
        data = json.loads(text)
        return cls(data["kind"], data["name"], data["mime_type"], int(data["size"]), sha256)


@dataclass(slots=True)
class OutboxPart:
    """One message part to deliver."""

    dedupe_key: str
    platform: str
    chat_id: str
    text: str
    thread_id: str | None = None
    reply_to: str | None = None
    edit_message_id: str | None = None
    part_index: int = 0
    parts_total: int = 1
    run_id: str | None = None
    lane: str | None = None  # ordering lane; None: the chat (platform:chat_id)
    choices: tuple[Choice, ...] = ()
    """Buttons under the message (platforms.base.Choice)."""
    file: FilePart | None = None
    """A file sent with ``text`` as its caption."""


@dataclass(slots=True)
class OutboxRow:
    """A persisted delivery and its state."""

    id: int
    dedupe_key: str
    run_id: str | None
    platform: str
    chat_id: str
    thread_id: str | None
    reply_to: str | None
    edit_message_id: str | None
    part_index: int
    parts_total: int
    text: str
    status: str
    attempts: int
    next_attempt_at: float
    platform_message_id: str | None
    last_error: str | None
    lane: str
    in_doubt: int = 0
    claimed_by: str | None = None
    claim_until: float | None = None
    choices: tuple[Choice, ...] = ()
    file: FilePart | None = None


@dataclass(slots=True)
class RunCompletion:
    """Everything written atomically when a run ends."""

    run_id: str
    inbox_id: int | None
    status: str
    result: str | None = None
    error: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    model_calls: int = 0
    model_seconds: float = 0.0
    session_key: str | None = None
    epoch: int | None = None
    transcript: list[ChatMessage] = field(default_factory=list)
    deliveries: list[OutboxPart] = field(default_factory=list)
    ended_by: str | None = None
    usage: RunUsage | None = None
    steered: list[Steered] = field(default_factory=list)
    """Messages steered into the run (gateway/steering.py): their inbox events and runs end with it."""
    charge: UserCharge | None = None
    """What the run used of its user's hourly budgets (gateway/limits.py)."""
    effects: list[Callable[[Connection], object]] = field(default_factory=list)
    """Other changes stored with the completion, in its transaction (an approval request: gateway/approvals.py)."""


@dataclass(slots=True)
class RunUsage:
    """The tokens a run's model calls used, as the model server reported them, and the model it asked (the
    ``run_usage`` row written with the run's completion); ``user_key`` is None for a webhook run."""

    kind: str
    user_key: str | None
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Count one model call's reported usage."""
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
