"""Slack's own media case end to end: a voice clip recorded in Slack arrives as an MP4 (its container says video)
and is still transcribed, not refused as a video."""

from __future__ import annotations

from pathlib import Path

from gateway.sim.model_server import ScriptedModel, last_user_text
from tests.gateway.media_chat_slack import slack_chat

# An MP4 as Slack records clips: an ftyp box with the mp42 brand (a video container to anything sniffing it).
CLIP = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + b"\x00\x00\x00\x08free" + bytes(64)


async def test_a_slack_voice_clip_in_mp4_is_transcribed(tmp_path: Path) -> None:
    async with ScriptedModel() as server, slack_chat(server, tmp_path) as chat:
        server.audio.set_transcript(CLIP, "call me back at five")
        try:
            await chat.start({"media": {"transcription": {"model": "whisper-1"}}})
            await chat.sim.user_sends_dm("", files=[chat.sim.user_audio_clip(CLIP, "video/mp4",
                                                                             "audio_message.mp4")])
            [answer] = await chat.texts(1)
        finally:
            for gateway in chat.gateways:
                await gateway.stop(drain_timeout=1)
    [heard] = server.audio.transcriptions
    assert heard.data == CLIP and heard.filename.endswith(".mp4")
    assert "call me back at five" in answer and "call me back at five" in last_user_text(server.requests[0])
