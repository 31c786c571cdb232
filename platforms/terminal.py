"""The terminal as a chat platform: one local user's direct messages, typed in and printed out.

``hermes-gateway chat`` runs a gateway with this adapter alone, so a line typed at the terminal is accepted,
routed, run and delivered exactly as a message from Telegram would be. ``say`` hands a line to the gateway and
returns a future done once its answer is printed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import ClassVar, TextIO

from platforms.base import Accepted, AdapterState, BasePlatformAdapter, MessageEvent, OnMessage, SendResult


class TerminalAdapter(BasePlatformAdapter):
    """Platform ``cli``: the chat is the local user's name; answers are written to ``out``."""

    name = "cli"
    max_message_length: ClassVar[int] = 1_000_000  # a terminal takes any length: one answer, one part

    def __init__(self, user: str, out: TextIO) -> None:
        super().__init__()
        self.user = user
        self._out = out
        self._on_message: OnMessage | None = None
        self._answered: dict[str, asyncio.Future[None]] = {}  # delivery id prefix -> its last part was printed

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        self._on_message = on_message
        self._receiving = receive
        self._set_state(AdapterState.CONNECTED)

    async def disconnect(self) -> None:
        self._receiving = False
        self._set_state(AdapterState.DISCONNECTED)

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        self._out.write(content.rstrip("\n") + "\n")
        self._out.flush()
        meta = metadata or {}
        if int(meta.get("part_index", "0")) + 1 >= int(meta.get("parts_total", "1")):
            waiter = self._answered.pop(meta.get("delivery_id", "").rpartition(":")[0], None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        return SendResult(success=True, message_id=uuid.uuid4().hex)

    async def say(self, text: str) -> tuple[Accepted | None, asyncio.Future[None] | None]:
        """Hand ``text`` to the gateway as the user's message: its acceptance and a future done once the last part
        answering it is printed (a command's reply, else its run's answer); (None, None) when it was refused."""
        if self._on_message is None:
            raise RuntimeError("the terminal adapter is not connected")
        event = MessageEvent(platform=self.name, event_id=uuid.uuid4().hex, chat_id=self.user, chat_type="dm",
                             user_id=self.user, user_name=self.user, text=text)
        command = f"cmd:{event.dedupe_key}"
        waiter = self._expect(command)  # a command is answered before on_message returns
        accepted = await self._on_message(event)
        if accepted is not None and accepted.run_id is None:
            return accepted, waiter
        self._answered.pop(command, None)
        return (None, None) if accepted is None else (accepted, self._expect(f"run:{accepted.run_id}"))

    def _expect(self, prefix: str) -> asyncio.Future[None]:
        waiter = self._answered[prefix] = asyncio.get_running_loop().create_future()
        return waiter
