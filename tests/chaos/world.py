"""The chaos test's world: every simulator in the test process, and gateway subprocesses pointed at them."""

from __future__ import annotations

import random
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gateway.sim.callback_sink import CallbackSink
from gateway.sim.discord_api import ALICE_ID, BOB_ID, DiscordSimulator
from gateway.sim.model_media import image_parts
from gateway.sim.model_server import ScriptedModel, Turn, last_user_text, tool_call
from gateway.sim.slack_api import SlackSimulator
from gateway.sim.telegram_api import TelegramSimulator
from tests.conftest import WEBHOOK_SECRET, base_config, deep_merge
from tests.gateway_process import GatewayProcess
from tests.media_samples import camera_jpeg, pdf_with_text, png_chart

TOKEN = re.compile(r"\b((?:tg|sl|dc|wh)-\d{5})\b")
TELEGRAM_USERS = (1001, 1002, 1003)
SLACK_USERS = ("U0USER1", "U0USER2", "U0USER3")
DISCORD_USERS = (ALICE_ID, BOB_ID)
STANDARD_SECRET = "whsec_" + "Y2hhb3MtdGVzdC1zdGFuZGFyZC13ZWJob29rcy1zZWNyZXQ="
WEBHOOK_ROUTES = {"github": ("github", WEBHOOK_SECRET), "hooks": ("standard-webhooks", STANDARD_SECRET)}
# What users attach (the gateway fetches, checks and prepares each: a real photo, a real PDF), and the workspace file
# an answer sends back when the message asks for it.
PHOTO = camera_jpeg(640, 480)
DOCUMENT = pdf_with_text("Minutes of the chaos meeting.")
DOCUMENT_NAME = "minutes.pdf"
SENT_FILE = "chart.png"
ASK_FOR_FILE = "and send the chart"


def reply_for(token: str) -> str:
    """What the scripted model answers to a message carrying ``token``."""
    return f"ack {token}"


def caption_for(token: str) -> str:
    """The caption of the file the model sends with its answer to a message carrying ``token`` and ASK_FOR_FILE."""
    return f"chart for {token}"


class AckModel:
    """Responder of the scripted model: ``ack <token>`` for the token in the user's message, slow on demand; when
    the message asks for the chart, ``send_file`` of it first (captioned with the token). Notes which media each
    token's message showed it: an image part ("photo"), the document announced by its name ("document")."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._slow = 0
        self._latency = (0.0, 0.0)
        self.media_seen: dict[str, set[str]] = defaultdict(set)

    def slow(self, n: int, low: float, high: float) -> None:
        """Answer the next ``n`` requests after a random latency in ``[low, high]`` seconds."""
        self._slow, self._latency = n, (low, high)

    def __call__(self, request: dict[str, Any]) -> Turn:
        asked = last_user_text(request)
        match = TOKEN.search(asked)
        if match and image_parts(request):
            self.media_seen[match.group(1)].add("photo")
        if match and DOCUMENT_NAME in asked:
            self.media_seen[match.group(1)].add("document")
        latency = None
        if self._slow > 0:
            self._slow -= 1
            latency = self._rng.uniform(*self._latency)
        if match and ASK_FOR_FILE in asked and request["messages"][-1]["role"] == "user":
            return tool_call("send_file", {"path": SENT_FILE, "caption": caption_for(match.group(1))}, latency=latency)
        return Turn(content=reply_for(match.group(1)) if match else "no token in this message", latency=latency)


@dataclass
class World:
    """The simulators, the gateway's config and home, and every gateway process started so far."""

    home: Path
    telegram: TelegramSimulator
    slack: SlackSimulator
    discord: DiscordSimulator
    model: ScriptedModel
    acks: AckModel
    sink: CallbackSink
    http: aiohttp.ClientSession
    processes: list[GatewayProcess] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), what happened)

    def mark(self, what: str) -> None:
        """Note a moment in the gateways' lives, to place a lost input's send time among them."""
        self.timeline.append((time.time(), what))

    def when(self, t: float) -> str:
        """``t`` (a ``time.time()``) relative to the last moment noted before it, and as a log timestamp."""
        last = max((m for m in self.timeline if m[0] <= t), default=None)
        stamp = time.strftime("%H:%M:%S", time.localtime(t)) + f",{int(t % 1 * 1000):03d}"
        return f"at {stamp}, {t - last[0]:.2f} s after {last[1]}" if last else f"at {stamp}"

    @property
    def config_path(self) -> Path:
        return self.home / "config.yaml"

    @property
    def db_path(self) -> Path:
        return self.home / "state.db"

    @property
    def gateway(self) -> GatewayProcess | None:
        """The newest gateway process (alive or not)."""
        return self.processes[-1] if self.processes else None

    def write_config(self) -> None:
        """The gateway's config: every platform on its simulator, limits out of the way of the traffic; and the
        workspace with the file answers send."""
        workspace = self.home / "workspace"
        workspace.mkdir(exist_ok=True)
        (workspace / SENT_FILE).write_bytes(png_chart())
        routes = {name: {"secret": secret, "scheme": scheme, "prompt": "Deliver {payload.token}",
                         "deliver_to": "callback:sink", "rate_limit_per_minute": 100_000, "max_concurrency": 8}
                  for name, (scheme, secret) in WEBHOOK_ROUTES.items()}
        overrides: dict[str, Any] = {
            "model": {"timeout": 30, "vision": True},  # photos reach the model as image parts
            # Kills here hit innocent runs at random, and every input must still complete: no poison-run cap.
            # Agent loops in two worker processes: a kill of the gateway takes them down with it (their socket
            # closes) and the restarted gateway starts new ones.
            "gateway": {"drain_timeout": 2, "max_run_attempts": 1_000_000, "agent_workers": 2},
            "limits": {"user_messages_per_minute": 100_000, "user_burst": 100_000},
            "auth": {"platforms": {"telegram": {"allowed_users": [str(u) for u in TELEGRAM_USERS]},
                                   "slack": {"allowed_users": list(SLACK_USERS)},
                                   "discord": {"allowed_users": [str(u) for u in DISCORD_USERS]}}},
            "platforms": {
                "webhook": {"routes": routes},
                "telegram": {"enabled": True, "token": self.telegram.token, "base_url": self.telegram.base_url,
                             "base_file_url": self.telegram.base_file_url, "poll_timeout": 5,
                             "rate_limit": {"overall_per_second": 0, "group_per_minute": 0}},
                "slack": {"enabled": True, "bot_token": self.slack.bot_token, "app_token": self.slack.app_token,
                          "signing_secret": self.slack.signing_secret, "api_base_url": self.slack.base_url,
                          "ping_interval": 2},
                "discord": {"enabled": True, "token": self.discord.token, "api_base_url": self.discord.api_base_url,
                            "guild_ready_timeout": 0.05, "reconnect_backoff": 0.05},
            },
        }
        config = deep_merge(base_config(self.home, self.model.base_url or "", self.sink.url), overrides)
        self.config_path.write_text(yaml.safe_dump(config))

    async def start_gateway(self) -> GatewayProcess:
        """Start a gateway process and wait for its startup line (not for its platforms to connect)."""
        process = GatewayProcess(self.config_path, self.home)
        self.processes.append(process)
        self.mark(f"gateway {len(self.processes)} was started ({process.stderr_path.name})")
        await process.start()
        self.mark(f"gateway {len(self.processes)} printed its startup line")
        return process

    async def stop(self) -> None:
        """Kill what is still running, stop the simulators."""
        for process in self.processes:
            if process.proc is not None and process.proc.returncode is None:
                await process.kill()
        await self.http.close()
        for sim in (self.sink, self.discord, self.slack, self.telegram, self.model):
            await sim.stop()
