"""The platform contract: normalized events, send results, the adapter base class and message splitting.

Stdlib only. Adapters import this module; nothing here knows about the gateway.
"""

from __future__ import annotations

import abc
import enum
import re
import types
import unicodedata
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, Protocol, get_args

from platforms.files import AttachmentUnavailable, OutgoingFile, OutgoingKind

AttachmentKind = Literal["photo", "document", "voice", "audio", "video", "file"]
ChatType = Literal["dm", "group", "channel"]

_ATTACHMENT_KINDS = frozenset(get_args(AttachmentKind))
_CHAT_TYPES = frozenset(get_args(ChatType))


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file on an incoming message; `file_id` is the platform's handle for fetching it."""

    kind: AttachmentKind
    file_id: str
    name: str | None = None
    mime_type: str | None = None
    size: int | None = None
    url: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in _ATTACHMENT_KINDS:
            raise ValueError(f"unknown attachment kind {self.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Attachment:
        """Inverse of `to_dict`."""
        return cls(
            kind=data["kind"],
            file_id=data["file_id"],
            name=data.get("name"),
            mime_type=data.get("mime_type"),
            size=data.get("size"),
            url=data.get("url"),
        )


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class MessageEvent:
    """One incoming message, normalized across platforms.

    `event_id` is the platform's unique id for this delivery; `dedupe_key` makes it unique across platforms.
    `received_at` must be timezone-aware and is stored in UTC.
    """

    platform: str
    event_id: str
    chat_id: str
    chat_type: ChatType
    user_id: str
    user_name: str | None
    text: str
    message_id: str | None = None
    thread_id: str | None = None
    reply_to_message_id: str | None = None
    mentions_bot: bool = False
    attachments: tuple[Attachment, ...] = ()
    received_at: datetime = field(default_factory=_utc_now)
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.chat_type not in _CHAT_TYPES:
            raise ValueError(f"unknown chat type {self.chat_type!r}")
        if self.received_at.tzinfo is None or self.received_at.utcoffset() is None:
            raise ValueError("received_at must be timezone-aware")
        object.__setattr__(self, "received_at", self.received_at.astimezone(UTC))
        object.__setattr__(self, "attachments", tuple(self.attachments))

    @property
    def dedupe_key(self) -> str:
        """Idempotency key for the inbox: ``"<platform>:<event_id>"``."""
        return f"{self.platform}:{self.event_id}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (datetimes as ISO 8601); `from_dict` restores an equal event."""
        return {
            "platform": self.platform,
            "event_id": self.event_id,
            "chat_id": self.chat_id,
            "chat_type": self.chat_type,
            "user_id": self.user_id,
            "user_name": self.user_name,
            "text": self.text,
            "message_id": self.message_id,
            "thread_id": self.thread_id,
            "reply_to_message_id": self.reply_to_message_id,
            "mentions_bot": self.mentions_bot,
            "attachments": [a.to_dict() for a in self.attachments],
            "received_at": self.received_at.isoformat(),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MessageEvent:
        """Inverse of `to_dict`; raises KeyError or ValueError on malformed data."""
        return cls(
            platform=data["platform"],
            event_id=data["event_id"],
            chat_id=data["chat_id"],
            chat_type=data["chat_type"],
            user_id=data["user_id"],
            user_name=data["user_name"],
            text=data["text"],
            message_id=data.get("message_id"),
            thread_id=data.get("thread_id"),
            reply_to_message_id=data.get("reply_to_message_id"),
            mentions_bot=bool(data.get("mentions_bot", False)),
            attachments=tuple(Attachment.from_dict(a) for a in data.get("attachments", ())),
            received_at=datetime.fromisoformat(data["received_at"]),
            metadata=dict(data.get("metadata", {})),
        )


@dataclass(frozen=True, slots=True)
class SessionSource:
    """Where a conversation lives; gateway/session.py turns it into a session key."""

    platform: str
    chat_id: str
    chat_type: ChatType
    user_id: str
    thread_id: str | None = None

    @classmethod
    def from_event(cls, event: MessageEvent) -> SessionSource:
        """The source of an incoming message."""
        return cls(event.platform, event.chat_id, event.chat_type, event.user_id, event.thread_id)


@dataclass(frozen=True, slots=True)
class SendResult:
    """Outcome of a send or edit; `retry_after` (seconds) is the platform's own back-off hint."""

    success: bool
    message_id: str | None = None
    error: str | None = None
    retryable: bool = False
    retry_after: float | None = None


MAX_CHOICES = 6


@dataclass(frozen=True, slots=True)
class Choice:
    """A button under a message. Pressing it arrives as a message from the presser whose text is ``command`` (a
    gateway command such as ``/approve once 3f2a``), or ``label`` when there is no command (a ``clarify`` answer);
    its ``metadata["pressed_message_id"]`` names the message that carried the button."""

    label: str
    command: str | None = None
    style: Literal["primary", "danger", "default"] = "default"

    @property
    def text(self) -> str:
        """The message a press sends."""
        return self.command or self.label

    def to_dict(self) -> dict[str, str | None]:
        """JSON form (stored with an outbox part)."""
        return {"label": self.label, "command": self.command, "style": self.style}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Choice:
        """Inverse of ``to_dict``."""
        return cls(data["label"], data.get("command"), data.get("style", "default"))


def choices_as_text(choices: Sequence[Choice]) -> str:
    """Choices as lines a user can type, for platforms (or messages) without buttons."""
    return "\n".join(f"• {c.label}: {c.command}" if c.command else f"{n}. {c.label}"
                     for n, c in enumerate(choices, 1))


@dataclass(frozen=True, slots=True)
class MenuCommand:
    """One entry of a platform's native command menu (Telegram's command list, Discord's slash commands)."""

    name: str
    description: str


class GatewayClosing(RuntimeError):
    """Raised by ``on_message`` during shutdown: do not acknowledge, the platform delivers again later."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """The gateway took an event: durably stored now, or earlier (``duplicate``); ``run_id`` if it started one."""

    run_id: str | None
    duplicate: bool


OnMessage = Callable[[MessageEvent], Awaitable[Accepted | None]]


class PlatformState(Protocol):
    """Small durable values an adapter keeps across restarts, shared by the replicas of one gateway
    (e.g. Discord's backfill cursors); the gateway provides it on its store."""

    async def load(self, key: str) -> str | None:
        """The value saved under ``key``, or None."""
        ...

    async def save(self, key: str, value: str) -> None:
        """Replace the value under ``key``."""
        ...
"""Called by an adapter for each incoming event; returns once the event is durably accepted (None: refused)."""


class AdapterState(enum.StrEnum):
    """Connection lifecycle of an adapter, as reported on /readyz."""

    DISCONNECTED = "disconnected"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    FAILED = "failed"


class BasePlatformAdapter(abc.ABC):
    """One chat platform. Subclasses set the class attributes and implement connect, disconnect and send.

    An adapter awaits `on_message` for every incoming event and acknowledges the event to the platform
    only after it returns. `length_fn` measures a Markdown part as the platform counts it once `send`
    has formatted it (the gateway splits before formatting); it may be a plain function such as
    `utf16_len`, made a staticmethod automatically.

    Sending and receiving are separate: `connect(on_message, receive=False)` opens only what sending
    needs (every replica sends), and `start_receiving` / `stop_receiving` switch receiving on and off at
    runtime (connections that must be single run on one replica). The defaults only flip `receiving`:
    right for adapters with nothing to receive, or that receive on the gateway's HTTP server and answer
    there with a non-2xx status (so the platform delivers again) while `receiving` is false.
    """

    name: ClassVar[str]
    max_message_length: ClassVar[int]
    can_edit: ClassVar[bool] = False
    can_delete: ClassVar[bool] = False
    can_react: ClassVar[bool] = False
    can_buttons: ClassVar[bool] = False
    """Whether ``send_choices`` shows real buttons (else the choices are listed as text)."""
    length_fn: ClassVar[Callable[[str], int]] = len
    ordered_per_chat: ClassVar[bool] = True
    """Whether parts to one chat id must arrive in order (False: only one run's parts, e.g. HTTP callbacks)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get("length_fn")
        if isinstance(fn, types.FunctionType):
            cls.length_fn = staticmethod(fn)

    def __init__(self) -> None:
        self._state = AdapterState.DISCONNECTED
        self._last_error: str | None = None
        self._receiving = False
        self.on_rejected: Callable[[str, str], None] | None = None
        """Set by the gateway: called with (platform, reason) for each inbound event refused here."""
        self.state_store: PlatformState | None = None
        """Set by the gateway before ``connect``: where to keep state that must survive a restart."""

    def _rejected(self, reason: str) -> None:
        """Count an inbound event this adapter refused (bad signature, too large, ...)."""
        if self.on_rejected is not None:
            self.on_rejected(self.name, reason)

    @property
    def state(self) -> AdapterState:
        """Current lifecycle state."""
        return self._state

    @property
    def receiving(self) -> bool:
        """Whether this adapter takes events from the platform (or, while it is unreachable, tries to)."""
        return self._receiving

    def status(self) -> dict[str, str | bool | None]:
        """Readiness details: platform, state, whether it is receiving and the last recorded error."""
        return {"platform": self.name, "state": self._state.value, "receiving": self._receiving,
                "last_error": self._last_error}

    def _set_state(self, state: AdapterState, error: str | None = None) -> None:
        """Record a lifecycle transition; an error message is kept until the next one is recorded."""
        self._state = state
        if error is not None:
            self._last_error = error

    def split(self, text: str) -> list[str]:
        """`text` split into messages that fit this platform (see `split_message`)."""
        return split_message(text, self.max_message_length, self.length_fn)

    @abc.abstractmethod
    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        """Open what sending needs and keep `on_message` for incoming events; with `receive`, also start receiving."""

    @abc.abstractmethod
    async def disconnect(self) -> None:
        """Stop receiving and release connections."""

    async def start_receiving(self) -> None:
        """Start delivering incoming events to `on_message`; does nothing when already receiving."""
        self._receiving = True

    async def stop_receiving(self) -> None:
        """Stop taking events; sending keeps working. Does nothing when not receiving.

        An event the platform delivered but the adapter did not acknowledge stays with the platform, which
        delivers it again (to whichever replica receives next).
        """
        self._receiving = False

    @abc.abstractmethod
    async def send(
        self,
        chat_id: str,
        content: str,
        reply_to: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> SendResult:
        """Send one message that already fits `max_message_length`."""

    async def send_choices(self, chat_id: str, content: str, choices: Sequence[Choice], reply_to: str | None = None,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """Send one message with buttons (at most ``MAX_CHOICES``); a press comes back as a message (see ``Choice``).
        Without buttons on the platform: the choices listed as text under ``content``. Editing such a message
        (``edit_message``) removes its buttons."""
        return await self.send(chat_id, f"{content}\n\n{choices_as_text(choices)}", reply_to, metadata)

    async def set_commands(self, commands: Sequence[MenuCommand]) -> None:
        """Publish the platform's native command menu (called at start with the enabled commands); default:
        the platform has none."""
        return None

    async def edit_message(
        self,
        chat_id: str,
        message_id: str,
        content: str,
        metadata: Mapping[str, str] | None = None,
    ) -> SendResult:
        """Replace a sent message's text; unsupported unless the platform overrides it."""
        return SendResult(success=False, error=f"{self.name} does not support editing messages")

    async def delete_message(self, chat_id: str, message_id: str,
                             metadata: Mapping[str, str] | None = None) -> SendResult:
        """Delete a message the bot sent; unsupported unless the platform overrides it (and sets `can_delete`)."""
        return SendResult(success=False, error=f"{self.name} does not support deleting messages")

    async def send_typing(self, chat_id: str, metadata: Mapping[str, str] | None = None) -> None:
        """Show a typing indicator where the platform has one (default: nothing to do)."""
        return None

    async def set_reaction(self, chat_id: str, message_id: str, emoji: str | None, previous: str | None = None,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """Make ``emoji`` the bot's reaction on a message, replacing ``previous`` (the bot's earlier one, if known);
        None only removes ``previous``. Unsupported unless the platform overrides it (and sets `can_react`)."""
        return SendResult(success=False, error=f"{self.name} does not support reactions")

    # -- files (platforms/files.py) --

    def upload_limit(self, kind: OutgoingKind, chat_id: str | None = None) -> int:
        """The largest file of ``kind`` the bot may send (to ``chat_id``, where limits differ per chat), in bytes
        (0: it cannot send files)."""
        return 0

    async def fetch_attachment(self, attachment: Attachment, max_bytes: int) -> bytes:
        """The content of an incoming attachment, through the platform's API with the bot's credentials.

        Raises AttachmentTooLarge when it is over ``max_bytes`` (stopping the download there), AttachmentUnavailable
        when the platform refuses or fails it."""
        raise AttachmentUnavailable(f"{self.name}: downloading attachments is not supported")

    async def send_file(self, chat_id: str, file: OutgoingFile, caption: str = "", reply_to: str | None = None,
                        metadata: Mapping[str, str] | None = None) -> SendResult:
        """Send one file with an optional caption (already within ``max_message_length``), shown as its ``kind``
        allows here. ``metadata`` is as for ``send`` (``delivery_id``, ``in_doubt``, ``thread_id``): a part in
        doubt is looked up or sent again exactly as the platform allows, as for text."""
        return SendResult(success=False, error=f"{self.name} cannot send files")


# --- message splitting -------------------------------------------------------------------------------

MIN_SPLIT_LIMIT = 16

_FENCE = "```"
# A fence line: up to three spaces, three or more backticks, an info string without backticks.
_FENCE_LINE = re.compile(r" {0,3}`{3,}([^`]*)")
_LANG = re.compile(r"[A-Za-z0-9_+\-.#]+")
_MARK_CATEGORIES = frozenset({"Mn", "Mc", "Me"})
# How far back from the furthest end a hard cut looks for a clean spot (whole grapheme, whole fence line).
_CLEAN_CUT_SEARCH = 64


def utf16_len(s: str) -> int:
    """Length in UTF-16 code units, as Telegram counts it (a non-BMP character counts 2)."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def _fence_lang(line: str) -> str | None:
    """For a fence line, the language to reopen it with ('' if none usable); None for any other line."""
    m = _FENCE_LINE.fullmatch(line)
    if m is None:
        return None
    words = m.group(1).split()
    return words[0] if words and _LANG.fullmatch(words[0]) else ""


def _toggle(inside: str | None, line: str) -> str | None:
    """Fence state after a complete line: the open fence's language, or None outside any fence."""
    lang = _fence_lang(line)
    if lang is None:
        return inside
    return lang if inside is None else None


def _looks_like_fence(s: str) -> bool:
    return s.lstrip(" ")[:3] == _FENCE and _FENCE_LINE.fullmatch(s) is not None


def _binds(text: str, k: int) -> bool:
    """Whether text[k-1] and text[k] belong to one user-perceived character (cheap approximation)."""
    prev, ch = text[k - 1], text[k]
    if "\u200d" in (prev, ch) or (prev == "\r" and ch == "\n"):
        return True
    if (
        unicodedata.category(ch) in _MARK_CATEGORIES  # combining marks and variation selectors
        or "\U0001f3fb" <= ch <= "\U0001f3ff"  # emoji skin-tone modifiers
        or "\U000e0020" <= ch <= "\U000e007f"  # emoji tag sequences
    ):
        return True
    if _is_regional_indicator(prev) and _is_regional_indicator(ch):
        j = k - 1
        while j >= 0 and _is_regional_indicator(text[j]):
            j -= 1
        return (k - 1 - j) % 2 == 1  # an odd run before k means text[k] completes a flag
    return False


def _is_regional_indicator(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def _splits_surrogate_pair(text: str, k: int) -> bool:
    return k < len(text) and "\ud800" <= text[k - 1] <= "\udbff" and "\udc00" <= text[k] <= "\udfff"


def _reopen(lang: str, limit: int, length: Callable[[str], int]) -> str:
    """The fence that starts a part continuing a code block; the language only if it is cheap."""
    full = f"{_FENCE}{lang}\n"
    return full if lang and length(full + _FENCE) <= limit // 2 else f"{_FENCE}\n"


def _fit(text: str, start: int, prefix: str, suffix: str, limit: int, length: Callable[[str], int],
         within: int | None = None) -> int:
    """Largest k >= start with length(prefix + text[start:k] + suffix) <= limit (start if none); ``within``: a k
    known to be at least the answer (the fit without a suffix), tried first, since it usually fits as well."""

    def fits(k: int) -> bool:
        return length(prefix + text[start:k] + suffix) <= limit

    n = len(text)
    if within is not None:  # gallop down from `within`: a suffix usually costs a few characters at most
        if fits(within):
            return within
        hi, step = within, 8
        lo = max(start, within - step)
        while lo > start and not fits(lo):
            hi, step = lo, step * 2
            lo = max(start, within - step)
    else:  # gallop up from `limit` characters
        lo, step = start, limit
        hi = min(n, start + step)
        while fits(hi):
            if hi == n:
                return n
            lo, step = hi, step * 2
            hi = min(n, start + step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


class _Cuts:
    """Where the part beginning at `start` may end: text[start:k] for start < k <= end.

    `end` is the furthest end that fits as is, `end_closed` the furthest that fits with a closing fence.
    The fence state at a cut counts complete lines only: the line a cut falls inside is never a fence.
    """

    __slots__ = (
        "_end_closed",
        "_fence_at",
        "_line_begin",
        "_opened",
        "_start",
        "_starts",
        "_state",
        "_states",
        "_text",
        "end",
    )

    def __init__(self, text: str, start: int, line_begin: int, state: str | None, end: int, end_closed: int) -> None:
        self._text, self._start, self._line_begin, self._state = text, start, line_begin, state
        self.end, self._end_closed = end, end_closed
        self._fence_at: dict[int, bool] = {}
        # Line starts in (start, end], the fence state there and whether the line before opened a fence.
        self._starts: list[int] = []
        self._states: list[str | None] = []
        self._opened: list[bool] = []
        pos, line_was_cut = start, self._line_begin < start
        nl = text.find("\n", start, end)
        while nl != -1:
            opened = False
            if not line_was_cut:
                new = _toggle(state, text[pos:nl])
                opened, state = state is None and new is not None, new
            line_was_cut = False
            pos = nl + 1
            self._starts.append(pos)
            self._states.append(state)
            self._opened.append(opened)
            nl = text.find("\n", pos, end)

    def state_at(self, k: int) -> str | None:
        """Fence state if the part ends at k."""
        i = bisect_right(self._starts, k) - 1
        return self._states[i] if i >= 0 else self._state

    def line_begin(self, k: int) -> int:
        """Start of the line containing k (k itself at a line start)."""
        i = bisect_right(self._starts, k) - 1
        return self._starts[i] if i >= 0 else self._line_begin

    def choose(self) -> int:
        """The best end: paragraph break, line break, space, then anywhere (see `split_message`)."""
        t, start, end = self._text, self._start, self.end
        floor = start + (end - start) // 2
        newlines = self._starts[::-1]
        for k in newlines:
            if k > floor and k - 2 >= start and t[k - 2] == "\n" and self._ok(k, strict=True):
                return k
        for k in newlines:
            if k > floor and self._ok(k, strict=True):
                return k
        if self.state_at(end) is not None:  # in a code block a mid-line cut would break a code line
            for k in newlines:
                if self._ok(k, strict=True):
                    return k
        hi = end
        while (idx := max(t.rfind(" ", floor, hi), t.rfind("\t", floor, hi))) >= 0:
            if self._ok(idx + 1, strict=True):
                return idx + 1
            hi = idx
        for k in range(end, max(start, end - _CLEAN_CUT_SEARCH), -1):
            if self._ok(k, strict=True):
                return k
        for k in range(end, start, -1):
            if self._ok(k, strict=False):
                return k
        raise ValueError("message limit too small to make progress")

    def _ok(self, k: int, strict: bool) -> bool:
        if _splits_surrogate_pair(self._text, k):
            return False
        if self.state_at(k) is not None and k > self._end_closed:
            return False
        return not strict or self._clean(k)

    def _clean(self, k: int) -> bool:
        """Cut keeps characters whole, fence lines whole and avoids empty code blocks."""
        t = self._text
        if k < len(t) and _binds(t, k):
            return False
        if t[k - 1] == "\n":
            if self.state_at(k) is None:
                return True
            i = bisect_right(self._starts, k) - 1
            return not self._opened[i] and not self._is_fence_line(k)
        begin = self.line_begin(k)
        if begin >= self._start and self._is_fence_line(begin):
            return False
        if _looks_like_fence(t[max(begin, self._start) : k]):
            return False
        # The rest of the line opens the next part; only about one part's worth of it can show there.
        horizon = k + self.end - self._start
        nl = t.find("\n", k, horizon)
        return not _looks_like_fence(t[k : horizon if nl == -1 else nl])

    def _is_fence_line(self, begin: int) -> bool:
        if begin not in self._fence_at:
            nl = self._text.find("\n", begin)
            self._fence_at[begin] = _fence_lang(self._text[begin : None if nl == -1 else nl]) is not None
        return self._fence_at[begin]


def split_message(text: str, limit: int, length: Callable[[str], int] = len) -> list[str]:
    """Split `text` into parts whose `length` is at most `limit` ([] for empty text).

    Each part ends at the last paragraph break, else line break, else space in the second half of the
    space available, else as late as possible; inside a code block any line break beats breaking a code
    line. Characters are never split, nor (unless one alone exceeds the space) a base character from its
    combining marks, ZWJ sequence or variation selector. No character is dropped or added, except fence
    markers: a part that ends inside a fenced code block gets ``` appended right after its last character,
    and the next part starts with "```<lang>\\n" (or "```\\n" when the language is long for `limit`).
    Without fences ``"".join(parts) == text``; `join_parts` inverts the split in every case.

    Fences are Markdown fence lines (up to 3 spaces, 3+ backticks, an info string without backticks),
    toggling in and out of a block. A line that a split falls inside never counts as a fence, so a fence
    line longer than the limit cannot be kept balanced. `length` should mostly grow with the text (len and
    `utf16_len` always do; the length of a rendering of Markdown, an adapter's `length_fn`, nearly does):
    a part it measures over `limit` is cut earlier. Raises ValueError if `limit` < MIN_SPLIT_LIMIT or no
    progress is possible.
    """
    if limit < MIN_SPLIT_LIMIT:
        raise ValueError(f"message limit {limit} is below the minimum of {MIN_SPLIT_LIMIT}")
    if length(text) <= limit:
        return [text] if text else []
    parts: list[str] = []
    start, line_begin, state = 0, 0, None
    while True:
        prefix = "" if state is None else _reopen(state, limit, length)
        end = _fit(text, start, prefix, "", limit, length)
        if end == len(text):
            parts.append(prefix + text[start:])
            return parts
        end_closed = _fit(text, start, prefix, _FENCE, limit, length, within=end)
        while True:
            cuts = _Cuts(text, start, line_begin, state, end, end_closed)
            k = cuts.choose()
            part = prefix + text[start:k] + ("" if cuts.state_at(k) is None else _FENCE)
            if length(part) <= limit:
                break
            end = k - 1  # a length that can shrink as text grows (rendered Markdown): cut earlier
        parts.append(part)
        start, line_begin, state = k, cuts.line_begin(k), cuts.state_at(k)


@dataclass(slots=True)
class _FenceTracker:
    """Fence state of text fed so far, by the same rules as the splitter."""

    inside: str | None = None
    line: str = ""
    line_was_cut: bool = False

    def feed(self, text: str) -> None:
        lines = text.split("\n")
        if len(lines) > 1:
            if not self.line_was_cut:
                self.inside = _toggle(self.inside, self.line + lines[0])
            for line in lines[1:-1]:
                self.inside = _toggle(self.inside, line)
            self.line, self.line_was_cut = "", False
        self.line += lines[-1]

    def cut(self) -> None:
        if self.line:
            self.line_was_cut = True


def _strip_reopen(part: str, lang: str, index: int) -> str:
    for opener in (f"{_FENCE}{lang}\n", f"{_FENCE}\n"):
        if part.startswith(opener):
            return part[len(opener) :]
    raise ValueError(f"part {index} does not reopen the code block: not produced by split_message")


def join_parts(parts: Sequence[str]) -> str:
    """Rebuild the text given to `split_message` from its parts, removing the fence markers it added.

    Replays the splitter's fence state over the rebuilt text: a part that starts inside a block must start
    with the reopen marker, and a non-final part ending in ``` had that marker added exactly when the text
    before it ends inside a block (the state is the same with or without those backticks, since they end
    on the line they belong to). Raises ValueError for parts split_message could not have produced.
    """
    tracker = _FenceTracker()
    chunks: list[str] = []
    last = len(parts) - 1
    for i, part in enumerate(parts):
        if tracker.inside is not None:
            part = _strip_reopen(part, tracker.inside, i)
        if i < last and part.endswith(_FENCE):
            probe = replace(tracker)
            probe.feed(part[: -len(_FENCE)])
            probe.cut()
            if probe.inside is not None:
                tracker = probe
                chunks.append(part[: -len(_FENCE)])
                continue
        tracker.feed(part)
        if i < last:
            tracker.cut()
            if tracker.inside is not None:
                raise ValueError(f"part {i} ends inside a code block without a closing fence")
        chunks.append(part)
    return "".join(chunks)
