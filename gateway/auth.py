"""Who may talk to the agent: deny by default.

Webhook events are authorized by their signature (checked by the adapter), so they
always pass here. Chat users pass when their platform has ``allow_all``, or their
user id or chat id is allowlisted, or they are an admin.
"""

from __future__ import annotations

import logging

from gateway.config import AuthSettings
from platforms.base import MessageEvent

logger = logging.getLogger(__name__)

SIGNED_PLATFORMS = frozenset({"webhook", "cron"})


class Authorizer:
    """Allow/deny decisions for inbound events."""

    def __init__(self, cfg: AuthSettings) -> None:
        self.cfg = cfg
        self._admins = frozenset(cfg.admins)
        for platform, pa in cfg.platforms.items():
            if pa.allow_all:
                logger.warning("auth: %s allows every user (auth.platforms.%s.allow_all is true)", platform, platform)

    def is_admin(self, platform: str, user_id: str) -> bool:
        """Whether ``platform:user_id`` is listed in ``auth.admins``."""
        return f"{platform}:{user_id}" in self._admins

    def allows(self, event: MessageEvent) -> bool:
        """Whether the event may reach commands and the model."""
        if event.platform in SIGNED_PLATFORMS:
            return True
        if self.is_admin(event.platform, event.user_id):
            return True
        pa = self.cfg.platforms.get(event.platform)
        if pa is None:
            return False
        return pa.allow_all or event.user_id in pa.allowed_users or event.chat_id in pa.allowed_chats
