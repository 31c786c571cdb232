"""Builds the platform adapters that the configuration enables."""

from __future__ import annotations

from gateway.config import Config
from platforms.base import BasePlatformAdapter
from platforms.callback import CallbackAdapter, CallbackTarget
from platforms.webhook import WebhookAdapter, WebhookRoute


def build_adapters(cfg: Config) -> dict[str, BasePlatformAdapter]:
    """One adapter per enabled platform, keyed by platform name."""
    adapters: dict[str, BasePlatformAdapter] = {}
    wh = cfg.platforms.webhook
    if wh.enabled and wh.routes:
        adapters["webhook"] = WebhookAdapter({
            name: WebhookRoute(name=name, secrets=tuple(r.secrets()), scheme=r.scheme, prompt=r.prompt,
                               events=tuple(r.events), event_field=r.event_field,
                               rate_limit_per_minute=r.rate_limit_per_minute, max_body_bytes=r.max_body_bytes,
                               tolerance_seconds=r.tolerance_seconds)
            for name, r in wh.routes.items()})
    if cfg.platforms.callback.targets:
        adapters["callback"] = CallbackAdapter({
            name: CallbackTarget(t.url, t.secret.get_secret_value(), t.timeout)
            for name, t in cfg.platforms.callback.targets.items()})
    return adapters
