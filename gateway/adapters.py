"""Builds the platform adapters that the configuration enables.

A chat platform's module (and so its library: python-telegram-bot ~22 MiB, discord.py ~8, slack_bolt ~4 of
resident memory) is imported only when that platform is enabled, so a gateway pays for what it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Literal

from gateway.config import Config, DiscordPlatform, SlackPlatform, TelegramPlatform
from gateway.plugins import EnabledPlatform
from platforms.base import BasePlatformAdapter
from platforms.callback import CallbackAdapter, CallbackTarget
from platforms.forge import ForgeSettings, GitHubAdapter, GitLabAdapter
from platforms.webhook import WebhookAdapter, WebhookRoute

logger = logging.getLogger(__name__)


def _telegram(tg: TelegramPlatform, token: str) -> BasePlatformAdapter:
    from platforms.telegram import TelegramAdapter, TelegramSettings  # heavy optional library: only when enabled

    return TelegramAdapter(TelegramSettings(
        token=token, base_url=tg.base_url, base_file_url=tg.base_file_url, mode=tg.mode,
        webhook_url=tg.webhook_url, webhook_secret=tg.webhook_secret.get_secret_value() if tg.webhook_secret
        else None, webhook_path=tg.webhook_path, poll_timeout=tg.poll_timeout, group_trigger=tg.group_trigger,
        edited_messages=tg.edited_messages, max_attachment_bytes=tg.max_attachment_bytes,
        parse_mode=tg.parse_mode, overall_per_second=tg.rate_limit.overall_per_second,
        group_per_minute=tg.rate_limit.group_per_minute))


def _discord(dc: DiscordPlatform, token: str) -> BasePlatformAdapter:
    from platforms.discord import DiscordAdapter, DiscordSettings  # heavy optional library: only when enabled

    return DiscordAdapter(DiscordSettings(
        token=token, api_base_url=dc.api_base_url, gateway_url=dc.gateway_url,
        shard_count=dc.shard_count, shard_ids=tuple(dc.shard_ids) if dc.shard_ids is not None else None,
        respond_in_guilds=dc.respond_in_guilds, allowed_guilds=frozenset(dc.allowed_guilds),
        allowed_channels=frozenset(dc.allowed_channels), command_guilds=tuple(dc.command_guilds),
        allow_mentions=dc.allow_mentions,
        max_ratelimit_timeout=dc.max_ratelimit_timeout, heartbeat_timeout=dc.heartbeat_timeout,
        guild_ready_timeout=dc.guild_ready_timeout, reconnect_backoff=dc.reconnect_backoff,
        backfill_window=dc.backfill_window, state_file=dc.state_file))


def _slack(sl: SlackPlatform, bot_token: str) -> BasePlatformAdapter:
    from platforms.slack import SlackAdapter, SlackSettings  # heavy optional library: only when enabled

    return SlackAdapter(SlackSettings(
        bot_token=bot_token,
        app_token=sl.app_token.get_secret_value() if sl.app_token else None,
        signing_secret=sl.signing_secret.get_secret_value() if sl.signing_secret else None,
        mode=sl.mode, api_base_url=sl.api_base_url, events_path=sl.events_path,
        slash_command=sl.slash_command, reply_in_thread=sl.reply_in_thread, ping_interval=sl.ping_interval,
        assistant_status=sl.assistant_status))


def _plugin_adapter(name: str, enabled: EnabledPlatform) -> BasePlatformAdapter | None:
    """The adapter of a plugin's platform, or None (logged) when its factory fails or breaks the contract."""
    plugin = enabled.platform.plugin
    try:
        adapter = enabled.platform.adapter_factory(enabled.settings)
    except Exception as exc:  # one broken plugin never stops the other platforms
        logger.error("platform %s of plugin %s failed to build: %s: %s", name, plugin, type(exc).__name__, exc)
        return None
    if not isinstance(adapter, BasePlatformAdapter) or adapter.name != name:
        logger.error("platform %s of plugin %s not started: its factory must return a BasePlatformAdapter named "
                     "%r, not %r", name, plugin, name, adapter)
        return None
    return adapter


def build_adapters(cfg: Config, plugin_platforms: Mapping[str, EnabledPlatform] | None = None
                   ) -> dict[str, BasePlatformAdapter]:
    """One adapter per enabled platform, keyed by platform name; ``plugin_platforms``: the enabled platforms
    of plugins (``gateway.plugins.enabled_plugin_platforms``)."""
    adapters: dict[str, BasePlatformAdapter] = {}
    tg = cfg.platforms.telegram
    if tg.enabled and tg.token is not None:
        adapters["telegram"] = _telegram(tg, tg.token.get_secret_value())
    dc = cfg.platforms.discord
    if dc.enabled and dc.token is not None:
        adapters["discord"] = _discord(dc, dc.token.get_secret_value())
    sl = cfg.platforms.slack
    if sl.enabled and sl.bot_token is not None:
        adapters["slack"] = _slack(sl, sl.bot_token.get_secret_value())
    wh = cfg.platforms.webhook
    if wh.enabled and wh.routes:
        adapters["webhook"] = WebhookAdapter({
            name: WebhookRoute(name=name, secrets=tuple(r.secrets()), scheme=r.scheme, prompt=r.text_template,
                               mode=r.mode, events=tuple(r.events), event_field=r.event_field,
                               rate_limit_per_minute=r.rate_limit_per_minute, max_body_bytes=r.max_body_bytes,
                               tolerance_seconds=r.tolerance_seconds, replay_window_seconds=r.replay_window_seconds,
                               allow_unsigned_id=r.allow_unsigned_id)
            for name, r in wh.routes.items()})
    if cfg.platforms.callback.targets:
        adapters["callback"] = CallbackAdapter({
            name: CallbackTarget(t.url, t.secret.get_secret_value(), t.timeout)
            for name, t in cfg.platforms.callback.targets.items()})
    for forge, adapter in (("github", GitHubAdapter), ("gitlab", GitLabAdapter)):
        settings = getattr(cfg.platforms, forge)
        if settings.token is not None:
            adapters[forge] = adapter(ForgeSettings(settings.token.get_secret_value(), settings.api_base_url,
                                                    settings.timeout))
    for name, enabled in (plugin_platforms or {}).items():
        if (plugin_adapter := _plugin_adapter(name, enabled)) is not None:
            adapters[name] = plugin_adapter
    return adapters


def receives_on(cfg: Config, platform: str) -> Literal["leader", "all"]:
    """Which replicas receive ``platform``'s events: only the elected leader, or every replica.

    ``platforms.<p>.run_on`` as resolved by the config: Telegram webhook and Slack http mode are always
    "all", and so is a Discord replica given its own shards (``shard:<ids>``). Webhooks arrive on every
    replica's HTTP server, callbacks receive nothing, and a plugin's platform receives on every replica (the inbox
    accepts an event once): "all". Every replica sends on every platform.
    """
    p = cfg.platforms
    run_on = {"telegram": p.telegram.run_on, "slack": p.slack.run_on, "discord": p.discord.run_on}.get(platform)
    return "leader" if run_on == "leader" else "all"
