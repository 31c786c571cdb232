"""What the chaos test asserts: every input has exactly one completed run (a photo or document it carries shown to the
model), every answer (and the file it sends when asked for one) was delivered exactly once and in order, judged by
the gateway's database (read after shutdown) and the simulators' own records."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.driver import CHATS, PLATFORMS, Driver, Input
from tests.chaos.world import TOKEN, World, caption_for, reply_for

MAX_LISTED = 15  # offenders listed per kind; the count says how many there were


@dataclass(slots=True, frozen=True)
class Reply:
    """A bot message as its platform shows it now (edits applied), or one callback delivery."""

    platform: str
    chat: str
    text: str  # or the caption of a file
    ident: str  # the platform's message id, or the callback's webhook-id
    has_file: bool = False

    @property
    def part(self) -> str:
        """Which part of an answer it shows: the text ("answer") or the file sent with it ("file")."""
        return "file" if self.has_file else "answer"


@dataclass(slots=True, frozen=True)
class InboxRow:
    """An accepted event (table ``inbox``)."""

    id: int
    dedupe_key: str
    session_key: str
    status: str
    run_id: str | None


@dataclass(slots=True, frozen=True)
class RunRow:
    """A run (table ``runs``)."""

    id: str
    status: str
    result: str | None
    attempts: int


@dataclass(slots=True, frozen=True)
class OutboxRow:
    """A part to deliver (table ``outbox``)."""

    id: int
    dedupe_key: str
    run_id: str | None
    platform: str
    chat_id: str
    status: str
    attempts: int
    in_doubt: int
    lane: str  # parts of one lane go out in order: a chat, or (callbacks) one run's parts
    file: str | None  # the name of the file it sends; None for text

    @property
    def part(self) -> str:
        """``Reply.part`` of what it delivers."""
        return "answer" if self.file is None else "file"


@dataclass(slots=True)
class Db:
    """The gateway's inbox, runs and outbox."""

    inbox: dict[str, InboxRow]
    runs: dict[str, RunRow]
    outbox: list[OutboxRow]


def read_db(path: Path) -> Db:
    """Read the tables the checks need (after the gateway stopped)."""
    with closing(sqlite3.connect(path, timeout=10)) as db:
        inbox = {r[1]: InboxRow(*r) for r in db.execute(
            "SELECT id, dedupe_key, session_key, status, run_id FROM inbox ORDER BY id")}
        runs = {r[0]: RunRow(*r) for r in db.execute("SELECT id, status, result, attempts FROM runs")}
        outbox = [OutboxRow(*r[:-1], json.loads(r[-1])["name"] if r[-1] else None) for r in db.execute(
            "SELECT id, dedupe_key, run_id, platform, chat_id, status, attempts, in_doubt, lane, file FROM outbox "
            "ORDER BY id")]
    return Db(inbox, runs, outbox)


def db_progress(path: Path) -> tuple[set[str], int, int, int]:
    """While the gateway runs: (inbox keys, inbox rows not finished, outbox parts not sent, outbox parts sent)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
        keys = {row[0] for row in db.execute("SELECT dedupe_key FROM inbox")}
        busy = db.execute("SELECT count(*) FROM inbox WHERE status IN ('pending', 'running')").fetchone()[0]
        pending = db.execute("SELECT count(*) FROM outbox WHERE status = 'pending'").fetchone()[0]
        sent = db.execute("SELECT count(*) FROM outbox WHERE status = 'sent'").fetchone()[0]
    return keys, busy, pending, sent


_TELEGRAM_FILES = ("photo", "document", "voice", "audio")


def delivered(world: World) -> list[Reply]:
    """Every answer and file the platforms show, per chat in the order they appeared, and every callback
    delivery."""
    tg, replies = world.telegram, []
    for chat in sorted({s.chat_id for s in tg.sent_messages() + tg.sent_media() if s.chat_id is not None}):
        replies += [Reply("telegram", str(chat), m.get("text", m.get("caption", "")), str(m["message_id"]),
                          any(k in m for k in _TELEGRAM_FILES))
                    for m in tg.chat_history(chat) if m["from"]["id"] == tg.bot_id]
    replies += [Reply("slack", m.channel, m.final_text, m.ts, bool(m.files)) for m in world.slack.messages()]
    replies += [Reply("discord", str(m["channel_id"]), m["content"], str(m["id"]), bool(m["attachments"]))
                for m in world.discord.bot_messages()]
    replies += [Reply("callback", d["target"], d["text"], d["webhook-id"]) for d in world.sink.received]
    return replies


@dataclass(slots=True)
class Verdict:
    """Offenders by kind (empty: the guarantees held)."""

    offenders: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    in_doubt_repeats: int = 0  # Telegram answers (or files) shown twice because their part was caught mid-send

    def add(self, kind: str, line: str) -> None:
        self.offenders[kind].append(line)

    def failure_message(self, logs: Path) -> str:
        parts = [f"the chaos test found {sum(map(len, self.offenders.values()))} violations (gateway logs: {logs})"]
        for kind, lines in self.offenders.items():
            parts.append(f"{kind} ({len(lines)}):")
            parts += [f"  {line}" for line in lines[:MAX_LISTED]]
            if len(lines) > MAX_LISTED:
                parts.append(f"  ... and {len(lines) - MAX_LISTED} more")
        return "\n".join(parts)


def verify(inputs: Sequence[Input], db: Db, replies: Sequence[Reply], driver_problems: Iterable[str],
           when: Callable[[float], str], media_seen: Mapping[str, set[str]]) -> Verdict:
    """Check the guarantees; see the module docstring. ``when`` places a send time in the gateway's lives;
    ``media_seen``: token -> the media its message showed the model."""
    v = Verdict()
    for problem in driver_problems:
        v.add("webhook answers a sender would reject", problem)
    for inp in inputs:
        if inp.media and inp.media not in media_seen.get(inp.token, set()):
            v.add("media the model never saw", f"{inp.platform} chat {inp.reply_chat} {inp.token}: a {inp.media}")
    by_token = {i.token: i for i in inputs}
    run_of: dict[str, str] = {}  # token -> run id
    for inp in inputs:
        row = db.inbox.get(inp.dedupe_key)
        if row is None:
            v.add("lost: never reached the inbox", f"{inp.platform} chat {inp.reply_chat} {inp.token} "
                                                   f"({inp.dedupe_key}), sent {when(inp.sent_at)}")
            continue
        run = db.runs.get(row.run_id or "")
        if run is None:
            v.add("accepted without a run", f"{inp.token}: inbox row {row.id} status={row.status}")
            continue
        run_of[inp.token] = run.id
        if run.status != "completed" or run.result != reply_for(inp.token) or row.status != "done":
            v.add("run not completed", f"{inp.token}: run {run.id} status={run.status} attempts={run.attempts} "
                                       f"result={run.result!r} inbox status={row.status}")
        if inp.run_id is not None and inp.run_id != run.id:
            v.add("webhook answers a sender would reject", f"{inp.token}: 202 named run {inp.run_id}, "
                                                           f"the inbox row has run {run.id}")
    known_runs = set(run_of.values())
    for run in db.runs.values():
        if run.id not in known_runs:
            v.add("runs no input asked for", f"run {run.id} status={run.status} result={run.result!r}")

    parts_of: dict[str, list[OutboxRow]] = defaultdict(list)
    for row in db.outbox:
        parts_of[row.run_id or ""].append(row)
    token_of_run = {run: token for token, run in run_of.items()}
    for token, run_id in run_of.items():
        parts = parts_of.get(run_id, [])
        expected = ["answer", "file"] if by_token[token].wants_file else ["answer"]
        if [p.part for p in parts] != expected or any(p.status != "sent" for p in parts):
            v.add("outbox parts not sent once", f"{token}: run {run_id} parts "
                                                f"{[(p.id, p.part, p.status, p.attempts) for p in parts]}, "
                                                f"expected {expected} sent")
    _check_replies(v, inputs, by_token, run_of, parts_of, replies)
    _check_order(v, inputs, db, token_of_run, replies)
    return v


def _expected_text(inp: Input, part: str) -> str | None:
    """What a reply showing ``part`` of ``inp``'s answer says; None if that answer has no such part."""
    if part == "file":
        return caption_for(inp.token) if inp.wants_file else None
    return reply_for(inp.token)


def _check_replies(v: Verdict, inputs: Sequence[Input], by_token: dict[str, Input], run_of: dict[str, str],
                   parts_of: dict[str, list[OutboxRow]], replies: Sequence[Reply]) -> None:
    seen: dict[tuple[str, str], list[Reply]] = defaultdict(list)  # (token, part) -> replies showing it
    for reply in replies:
        match = TOKEN.search(reply.text)
        inp = by_token.get(match.group(1)) if match else None
        if inp is None or reply.text != _expected_text(inp, reply.part) or (reply.platform, reply.chat) != (
                inp.reply_platform, inp.reply_chat):
            v.add("unexpected replies", f"{reply.platform} chat {reply.chat} message {reply.ident}: {reply.text!r}"
                                        + (" with a file" if reply.has_file else ""))
            continue
        seen[(inp.token, reply.part)].append(reply)
    for inp in inputs:
        if inp.token not in run_of:
            continue  # reported as lost already
        parts = parts_of.get(run_of[inp.token], [])
        if inp.reply_platform == "callback":
            ids = Counter(r.ident for r in seen.get((inp.token, "answer"), []))
            expected = {p.dedupe_key for p in parts}
            if set(ids) != expected:
                v.add("callback deliveries with the wrong webhook-ids" if ids else "missing replies",
                      f"{inp.token}: webhook-ids {dict(ids)}, outbox delivery keys {sorted(expected)}")
            continue
        for part in ("answer", "file") if inp.wants_file else ("answer",):
            _check_shown_once(v, inp, part, seen.get((inp.token, part), []), [p for p in parts if p.part == part])


def _check_shown_once(v: Verdict, inp: Input, part: str, got: list[Reply], rows: list[OutboxRow]) -> None:
    """One part of an answer shows exactly once (on Telegram, once more for each time it was caught mid-send)."""
    what = f"{inp.platform} chat {inp.reply_chat} {inp.token} ({part})"
    outbox = [(p.id, p.status, p.attempts) for p in rows]
    if not got:
        v.add("missing replies", f"{what}: outbox {outbox}")
    elif len(got) > 1:
        in_doubt = [p.in_doubt for p in rows]
        if inp.platform == "telegram" and len(got) - 1 <= max(in_doubt, default=0):
            v.in_doubt_repeats += len(got) - 1
            return  # the Bot API has no idempotency key: each send a kill cut short may have arrived
        v.add("duplicate replies", f"{what}: {len(got)} messages {[r.ident for r in got]}; outbox {outbox} "
                                   f"in_doubt={in_doubt}")


def _first_parts(replies: Iterable[Reply]) -> list[tuple[str, str]]:
    """(token, part) of each reply, in order, at its first showing."""
    shown: dict[tuple[str, str], None] = {}
    for reply in replies:
        if match := TOKEN.search(reply.text):
            shown.setdefault((match.group(1), reply.part))
    return list(shown)


def _order(v: Verdict, kind: str, where: str, got: Sequence[object], want: Sequence[object]) -> None:
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        v.add(kind, f"{where}: from position {at}: {got[at:at + 6]} but expected {want[at:at + 6]}")


def _check_order(v: Verdict, inputs: Sequence[Input], db: Db, token_of_run: dict[str, str],
                 replies: Sequence[Reply]) -> None:
    # 1. a chat shows the parts of each outbox lane in the lane's order (the sender's discipline)
    lanes: dict[str, list[OutboxRow]] = defaultdict(list)
    for row in db.outbox:
        if row.status == "sent" and row.run_id in token_of_run:
            lanes[row.lane].append(row)
    shown: dict[tuple[str, str], list[Reply]] = defaultdict(list)
    for reply in replies:
        shown[(reply.platform, reply.chat)].append(reply)
    for lane, rows in lanes.items():
        want = [(token_of_run[r.run_id or ""], r.part) for r in rows]
        wanted = set(want)
        got = [p for p in _first_parts(shown.get((rows[0].platform, rows[0].chat_id), [])) if p in wanted]
        _order(v, "chats answered out of outbox order", f"lane {lane}", got, want)
    # 2. a session's answers follow the order its messages were accepted in (one run at a time, in order).
    # Telegram and Discord hand a chat's messages over one after another; Slack delivers events (and its
    # retries after a kill) concurrently, so which of two racing events is accepted first is arbitrary there.
    position = {row.run_id: i for i, row in enumerate(db.outbox)}
    sessions: dict[str, list[InboxRow]] = defaultdict(list)
    for row in db.inbox.values():
        if row.run_id in token_of_run and row.session_key.startswith(("telegram:", "discord:")):
            sessions[row.session_key].append(row)
    for key, rows in sessions.items():
        accepted = [token_of_run[r.run_id or ""] for r in sorted(rows, key=lambda r: r.id)]
        answered = [token_of_run[r.run_id or ""] for r in sorted(rows, key=lambda r: position.get(r.run_id, -1))]
        _order(v, "sessions answered out of acceptance order", f"session {key}", answered, accepted)
    # 3. Telegram and Discord deliver a chat's messages in order: the gateway accepts them in that order
    for platform in ("telegram", "discord"):
        chats: dict[str, list[Input]] = defaultdict(list)
        for inp in inputs:
            if inp.platform == platform and inp.dedupe_key in db.inbox:
                chats[inp.reply_chat].append(inp)
        for chat, sent in chats.items():
            accepted = [i.token for i in sorted(sent, key=lambda i: db.inbox[i.dedupe_key].id)]
            _order(v, "messages accepted out of the order they were sent", f"{platform} chat {chat}",
                   accepted, [i.token for i in sent])


def figures(world: World, driver: Driver, db: Db, replies: Sequence[Reply], verdict: Verdict) -> list[str]:
    """The counts printed at the end of the run."""
    sent = Counter(i.platform for i in driver.inputs)
    offered = driver.offered
    seen_updates = Counter(u["update_id"] for c in world.telegram.calls_of("getUpdates")
                           for u in (c.response or {}).get("result") or [])
    user_messages = {i.dedupe_key.split(":", 1)[1] for i in driver.inputs if i.platform == "discord"}
    dispatched = Counter(p["d"]["id"] for c in world.discord.connections for p in c.sent
                         if p.get("t") == "MESSAGE_CREATE" and p["d"]["id"] in user_messages)
    slack_mine = {i.dedupe_key.split(":", 1)[1] for i in driver.inputs if i.platform == "slack"}
    slack_attempts = sum(d.attempts - 1 for d in world.slack.deliveries if d.event_id in slack_mine)
    shown = Counter(r.platform for r in replies)
    files_shown = Counter(r.platform for r in replies if r.has_file)
    media = Counter(i.media for i in driver.inputs if i.media)
    seen = Counter(i.media for i in driver.inputs if i.media in world.acks.media_seen.get(i.token, set()))
    webhook_ids = Counter(r.ident for r in replies if r.platform == "callback")
    completed = sum(r.status == "completed" for r in db.runs.values())
    return [
        "inputs sent: " + ", ".join(f"{p} {sent[p]}" for p in PLATFORMS) + f" (total {len(driver.inputs)}); "
        f"with media {media.total()} (photos {media['photo']}, documents {media['document']}; the model saw "
        f"{seen['photo']} and {seen['document']}), asking for a file {sum(i.wants_file for i in driver.inputs)}",
        f"offered again: telegram updates re-offered {sum(n > 1 for n in seen_updates.values())}; "
        f"slack event retries {slack_attempts} ({offered.slack_retries} on purpose); "
        f"discord RESUMEs {len(world.discord.resumes)} (op 7 on purpose {offered.discord_reconnects}), "
        f"MESSAGE_CREATE replays {sum(n - 1 for n in dispatched.values())}, "
        f"backfill fetches {len(world.discord.calls_of('channel_messages'))}; "
        f"webhook redeliveries {offered.webhook_repeats} on purpose, {offered.webhook_retries} after no 2xx",
        f"runs: {len(db.runs)} ({completed} completed, {sum(r.attempts > 1 for r in db.runs.values())} redone "
        f"after a kill)",
        "replies delivered: " + ", ".join(f"{p} {shown[p]} ({files_shown[p]} files)" for p in CHATS)
        + f", callback {len(webhook_ids)} distinct webhook-ids in {shown['callback']} deliveries "
        f"({shown['callback'] - len(webhook_ids)} repeats)",
        f"in-doubt parts: {sum(p.in_doubt > 0 for p in db.outbox)} "
        f"({sum(p.in_doubt > 0 and p.file is not None for p in db.outbox)} files); "
        f"telegram answers and files shown twice while in doubt: {verdict.in_doubt_repeats}",
    ]
