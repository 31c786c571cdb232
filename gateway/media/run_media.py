"""A run's media, in one object for gateway/runs.py: the user's turn made from the message and its attachments, and
the files (and spoken answer) that go back with the answer."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.config import Config
from gateway.media.audio import media_client
from gateway.media.images import data_url, prepare_image
from gateway.media.inbound import MediaPreparer, RunInput
from gateway.media.outbound import requested_files, voice_answer
from gateway.media.vision import describe_image, model_sees_images
from gateway.store import FilePart
from platforms.base import BasePlatformAdapter, MessageEvent
from tools.media_tools import Describer


class RunMedia:
    """Media in and out for the runs of one gateway."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.workspace = Path(cfg.gateway.workspace)
        self.preparer = MediaPreparer(cfg.media, cfg.model, self.workspace)

    def sees_images(self, model: str) -> bool:
        """Whether ``model`` gets images as image parts (``model.vision``)."""
        return model_sees_images(self.cfg.model.vision, model)

    async def turn(self, event: MessageEvent, adapter: BasePlatformAdapter | None, session_key: str,
                   model: str) -> RunInput:
        """The user's turn: the message's text and what its attachments became (see gateway/media/inbound.py)."""
        return await self.preparer.prepare(event, adapter, session_key, sees_images=self.sees_images(model),
                                           can_analyze=self.cfg.media.vision is not None)

    async def answer_files(self, requests: Sequence[Mapping[str, str]], answer: str | None, voice: bool,
                           adapter: BasePlatformAdapter | None, chat_id: str
                           ) -> tuple[list[tuple[FilePart, str]], list[str]]:
        """The files that go with the answer (each with its caption: ``send_file``'s, then the spoken answer when
        the chat turned voice on), and a line for the user per file that cannot go."""
        if adapter is None:
            return [], []
        files, notes = await requested_files(requests, self.workspace, adapter, chat_id) if requests else ([], [])
        if voice and answer and adapter.upload_limit("voice", chat_id) > 0:
            spoken = await voice_answer(answer, self.cfg.media, self.cfg.model)
            if spoken is not None:
                files.append((spoken, ""))
        return files, notes


DESCRIPTION_TOKENS = 800


def vision_describer(cfg: Config) -> Describer | None:
    """What ``vision_analyze`` asks when the chat model cannot see: ``media.vision``'s model (None when unset). Each
    call makes its own client: the tool runs on a loop of its own (the async tool bridge)."""
    endpoint = cfg.media.vision
    if endpoint is None:
        return None

    async def describe(data: bytes, question: str) -> str:
        url = data_url(await asyncio.to_thread(prepare_image, data, cfg.media.image_max_side))
        client = media_client(endpoint, cfg.model)
        try:
            return await describe_image(client, endpoint.model, url, question, DESCRIPTION_TOKENS)
        finally:
            await client.close()
    return describe
