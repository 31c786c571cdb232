"""The platform contract: events, results, the adapter base class and message splitting."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platforms.base import (
    MIN_SPLIT_LIMIT,
    AdapterState,
    Attachment,
    BasePlatformAdapter,
    MessageEvent,
    SendResult,
    SessionSource,
    join_parts,
    split_message,
    utf16_len,
)

# --- events ---------------------------------------------------------------------------------------------


def _event(**overrides: object) -> MessageEvent:
    fields: dict[str, object] = {
        "platform": "telegram",
        "event_id": "update-42",
        "chat_id": "-100123",
        "chat_type": "group",
        "user_id": "7",
        "user_name": "ada",
        "text": "hello",
    }
    fields.update(overrides)
    return MessageEvent(**fields)  # type: ignore[arg-type]


def test_event_round_trips_through_json() -> None:
    event = _event(
        message_id="99",
        thread_id="t1",
        reply_to_message_id="98",
        mentions_bot=True,
        attachments=(
            Attachment("photo", "AgAD", name="cat.jpg", mime_type="image/jpeg", size=1024, url="https://x/y"),
            Attachment("voice", "AwAD"),
        ),
        received_at=datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=UTC),
        metadata={"update_id": "42"},
    )
    restored = MessageEvent.from_dict(json.loads(json.dumps(event.to_dict())))
    assert restored == event
    assert restored.received_at.tzinfo is not None
    assert event.to_dict()["received_at"] == "2024-05-01T12:30:15.123456+00:00"


_texts = st.text(max_size=40)
_optional = st.none() | _texts


@settings(max_examples=60)
@given(
    event=st.builds(
        MessageEvent,
        platform=_texts,
        event_id=_texts,
        chat_id=_texts,
        chat_type=st.sampled_from(["dm", "group", "channel"]),
        user_id=_texts,
        user_name=_optional,
        text=st.text(),
        message_id=_optional,
        thread_id=_optional,
        reply_to_message_id=_optional,
        mentions_bot=st.booleans(),
        attachments=st.lists(
            st.builds(
                Attachment,
                kind=st.sampled_from(["photo", "document", "voice", "audio", "video", "file"]),
                file_id=_texts,
                name=_optional,
                mime_type=_optional,
                size=st.none() | st.integers(min_value=0, max_value=2**40),
                url=_optional,
            ),
            max_size=3,
        ).map(tuple),
        received_at=st.datetimes(timezones=st.just(UTC)),
        metadata=st.dictionaries(_texts, _texts, max_size=3),
    )
)
def test_any_event_round_trips(event: MessageEvent) -> None:
    assert MessageEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event


def test_received_at_must_be_aware_and_is_stored_in_utc() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        _event(received_at=datetime(2024, 1, 1))
    local = datetime(2024, 1, 1, 9, 0, tzinfo=timezone(timedelta(hours=9)))
    event = _event(received_at=local)
    assert event.received_at == local
    assert event.received_at.utcoffset() == timedelta(0)


def test_event_validates_kinds_and_defaults() -> None:
    with pytest.raises(ValueError, match="chat type"):
        _event(chat_type="room")
    with pytest.raises(ValueError, match="attachment kind"):
        Attachment("sticker", "x")  # type: ignore[arg-type]
    event = _event()
    assert (event.attachments, event.metadata, event.mentions_bot) == ((), {}, False)
    assert event.received_at.tzinfo is not None


def test_dedupe_key_and_session_source() -> None:
    event = _event(thread_id="t9")
    assert event.dedupe_key == "telegram:update-42"
    assert SessionSource.from_event(event) == SessionSource("telegram", "-100123", "group", "7", "t9")


def test_send_result_defaults() -> None:
    result = SendResult(success=True)
    assert (result.message_id, result.error, result.retryable, result.retry_after) == (None, None, False, None)


# --- adapter base ---------------------------------------------------------------------------------------


class _EchoAdapter(BasePlatformAdapter):
    name = "echo"
    max_message_length = 16
    length_fn = utf16_len

    async def connect(self, on_message, *, receive=True):  # type: ignore[no-untyped-def]
        self._set_state(AdapterState.CONNECTED)
        if receive:
            await self.start_receiving()

    async def disconnect(self) -> None:
        self._set_state(AdapterState.DISCONNECTED)

    async def send(self, chat_id, content, reply_to=None, metadata=None) -> SendResult:  # type: ignore[no-untyped-def]
        return SendResult(success=True, message_id="1")


async def test_adapter_defaults_and_status() -> None:
    adapter = _EchoAdapter()
    assert adapter.status() == {"platform": "echo", "state": "disconnected", "receiving": False, "last_error": None}
    await adapter.connect(lambda event: None)  # type: ignore[arg-type,return-value]
    assert adapter.state is AdapterState.CONNECTED and adapter.receiving
    adapter._set_state(AdapterState.FAILED, "token rejected")
    assert adapter.status() == {"platform": "echo", "state": "failed", "receiving": True,
                                "last_error": "token rejected"}

    edited = await adapter.edit_message("c", "1", "new text")
    assert not edited.success and not edited.retryable and "echo" in (edited.error or "")
    assert await adapter.send_typing("c") is None
    assert adapter.can_edit is False


async def test_receiving_defaults_switch_the_flag_idempotently() -> None:
    adapter = _EchoAdapter()
    await adapter.connect(lambda event: None, receive=False)  # type: ignore[arg-type,return-value]
    assert (adapter.state, adapter.receiving, adapter.status()["receiving"]) == (AdapterState.CONNECTED, False, False)
    for expected in (True, True, False, False, True):
        await (adapter.start_receiving() if expected else adapter.stop_receiving())
        assert adapter.receiving is expected and adapter.status()["receiving"] is expected
    assert (await adapter.send("c", "still sending")).success


def test_adapter_length_fn_is_not_bound_and_drives_split() -> None:
    adapter = _EchoAdapter()
    assert adapter.length_fn("😀") == 2
    assert adapter.split("😀" * 9) == ["😀" * 8, "😀"]


def test_adapter_requires_the_abstract_methods() -> None:
    class Incomplete(BasePlatformAdapter):
        name = "x"
        max_message_length = 100

    with pytest.raises(TypeError):
        Incomplete()  # type: ignore[abstract]


# --- splitting: table ----------------------------------------------------------------------------------

_CODE = "```python\n" + "".join(f"x = {i}  # value\n" for i in range(8)) + "```\nAfter the code.\n"


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        pytest.param("", 16, [], id="empty"),
        pytest.param("hello world", 16, ["hello world"], id="short"),
        pytest.param("a" * 16, 16, ["a" * 16], id="exactly-limit"),
        pytest.param("a" * 17, 16, ["a" * 16, "a"], id="limit-plus-one"),
        pytest.param("x" * 40, 16, ["x" * 16, "x" * 16, "x" * 8], id="long-word"),
        pytest.param("aaaa bbbb cccc dddd", 16, ["aaaa bbbb cccc ", "dddd"], id="space"),
        pytest.param("aaaa bbbb\ncccc dddd eeee", 16, ["aaaa bbbb\n", "cccc dddd eeee"], id="newline-over-space"),
        pytest.param("aaaaaaa\n\nb\ncc dd eeee", 16, ["aaaaaaa\n\n", "b\ncc dd eeee"], id="paragraph-over-newline"),
        pytest.param("ab cdefghijklmnopqrstuvwxyz", 16, ["ab cdefghijklmno", "pqrstuvwxyz"], id="early-space-ignored"),
        pytest.param(
            _CODE,
            48,
            [
                "```python\nx = 0  # value\nx = 1  # value\n```",
                "```python\nx = 2  # value\nx = 3  # value\n```",
                "```python\nx = 4  # value\nx = 5  # value\n```",
                "```python\nx = 6  # value\nx = 7  # value\n```\n",
                "After the code.\n",
            ],
            id="fence-reopened-with-language",
        ),
        pytest.param(
            "```py\n" + "y" * 40 + "\n```",
            24,
            ["```py\n" + "y" * 15 + "```", "```py\n" + "y" * 15 + "```", "```py\n" + "y" * 10 + "\n```"],
            id="code-line-longer-than-limit",
        ),
        pytest.param(
            "```averyverylonglanguage\n" + "z = 1\n" * 4 + "```",
            40,
            ["```averyverylonglanguage\nz = 1\nz = 1\n```", "```\nz = 1\nz = 1\n```"],
            id="long-language-reopened-bare",
        ),
        pytest.param(
            "inline ```code``` is text, not a fence " * 2,
            40,
            ["inline ```code``` is text, not a fence ", "inline ```code``` is text, not a fence "],
            id="inline-triple-backticks",
        ),
    ],
)
def test_split_table(text: str, limit: int, expected: list[str]) -> None:
    parts = split_message(text, limit)
    assert parts == expected
    assert join_parts(parts) == text


def test_split_counts_utf16_code_units() -> None:
    assert split_message("😀" * 8, 16, utf16_len) == ["😀" * 8]
    assert split_message("😀" * 9, 16, utf16_len) == ["😀" * 8, "😀"]
    assert split_message("😀" * 9, 16) == ["😀" * 9]
    assert split_message("a" + "😀" * 8, 16, utf16_len) == ["a" + "😀" * 7, "😀"]


@pytest.mark.parametrize(
    "cluster",
    [
        "👨\u200d👩\u200d👧",  # ZWJ family
        "e\u0301\u0302",  # combining accents
        "❤\ufe0f",  # variation selector
        "👍🏽",  # skin tone modifier
        "🇫🇷",  # flag (regional indicator pair)
        "\r\n",
    ],
)
def test_split_keeps_graphemes_whole(cluster: str) -> None:
    text = "ab" + cluster * 12
    parts = split_message(text, 16, utf16_len)
    assert "".join(parts) == text
    assert all(utf16_len(p) <= 16 for p in parts)
    assert all(p.startswith(cluster) for p in parts[1:])


def test_split_never_separates_surrogate_pair_code_points() -> None:
    pair = "\ud83d\ude00"  # a surrogate pair held as two code points
    text = "a" + pair * 10
    parts = split_message(text, 16, utf16_len)
    assert "".join(parts) == text
    assert all(not p.endswith("\ud83d") for p in parts)


def test_split_rejects_tiny_limit() -> None:
    with pytest.raises(ValueError, match="minimum"):
        split_message("anything", MIN_SPLIT_LIMIT - 1)


def test_split_reports_no_progress_for_a_hungry_length_function() -> None:
    with pytest.raises(ValueError, match="progress"):
        split_message("abc" * 20, 16, lambda s: 20 * len(s))


def test_join_rejects_parts_not_from_split() -> None:
    with pytest.raises(ValueError, match="reopen"):
        join_parts(["```py\ncode\n```", "no reopen marker"])
    with pytest.raises(ValueError, match="closing fence"):
        join_parts(["```py\ncode\n", "```py\nmore"])


def test_utf16_len() -> None:
    assert utf16_len("") == 0
    assert utf16_len("abc") == 3
    assert utf16_len("é😀") == 3
    assert utf16_len("\ud83d") == 1


# --- splitting: properties -----------------------------------------------------------------------------

_TRICKY = st.sampled_from(
    [
        "a",
        "b",
        " ",
        "\t",
        "\n",
        "\n\n",
        "`",
        "```",
        "```py\n",
        "\n```\n",
        "   ```js\n",
        "é",
        "\u0301",
        "😀",
        "\u200d",
        "\ufe0f",
        "🇫🇷",
        "\r\n",
        "\u3000",
        "💩💩",
    ]
)
_tricky_text = st.lists(st.one_of(_TRICKY, st.text(max_size=3)), max_size=60).map("".join)
_lengths = st.sampled_from([len, utf16_len])
_FENCE_LINE = re.compile(r" {0,3}`{3,}[^`]*")


def _ends_inside_fence(text: str) -> bool:
    inside = False
    for line in text.split("\n"):
        if _FENCE_LINE.fullmatch(line):
            inside = not inside
    return inside


@settings(max_examples=300)
@given(text=_tricky_text, limit=st.integers(MIN_SPLIT_LIMIT, 64), length=_lengths)
def test_split_properties_on_arbitrary_text(text: str, limit: int, length) -> None:  # type: ignore[no-untyped-def]
    parts = split_message(text, limit, length)
    assert all(0 < length(p) <= limit for p in parts)
    assert join_parts(parts) == text
    if "```" not in text:
        assert "".join(parts) == text
    for p in parts:
        p.encode("utf-8")  # no lone surrogate was created


_words = st.text("abcdefgh", min_size=1, max_size=8)
_line = st.lists(_words, min_size=1, max_size=4).map(" ".join)
_prose = st.lists(_line, min_size=1, max_size=4).map("\n".join)
_code = st.tuples(st.sampled_from(["", "py", "javascript", "c++"]), st.lists(_line, max_size=6)).map(
    lambda lc: f"```{lc[0]}\n" + "".join(f"{line}\n" for line in lc[1]) + "```"
)
_markdown = st.lists(st.one_of(_prose, _code), min_size=1, max_size=8).map("\n\n".join)


@settings(max_examples=200)
@given(text=_markdown, limit=st.integers(64, 200))
def test_split_keeps_fences_balanced(text: str, limit: int) -> None:
    parts = split_message(text, limit)
    assert join_parts(parts) == text
    for p in parts:
        assert len(p) <= limit
        assert not _ends_inside_fence(p), p


_clusters = st.lists(
    st.sampled_from(["a", "b", " ", "\n", "é", "e\u0301", "😀", "👨\u200d👩\u200d👧", "❤\ufe0f", "👍🏽", "🇫🇷", "🇩🇪"]),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200)
@given(clusters=_clusters, limit=st.integers(24, 48), length=_lengths)
def test_split_cuts_only_between_graphemes(clusters: list[str], limit: int, length) -> None:  # type: ignore[no-untyped-def]
    text = "".join(clusters)
    boundaries, pos = {0}, 0
    for c in clusters:
        pos += len(c)
        boundaries.add(pos)
    parts = split_message(text, limit, length)
    assert "".join(parts) == text
    pos = 0
    for p in parts:
        pos += len(p)
        assert pos in boundaries
