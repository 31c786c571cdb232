"""Who may talk to the agent: deny by default.

Webhook and cron events are authorized by their signature or origin, so they always
pass. Chat users pass when they are an admin, their platform has ``allow_all``, their
user or chat id is allowlisted, or an admin approved their pairing code. A denylisted
user never passes. A stranger in a DM may be offered a pairing code (``PAIR``).
"""

from __future__ import annotations

import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.config import AuthSettings
from gateway.pairing import PairingStore
from platforms.base import MessageEvent

logger = logging.getLogger(__name__)

SIGNED_PLATFORMS = frozenset({"webhook", "cron"})
_APPROVED_CACHE_SECONDS = 30.0
_APPROVED_CACHE_SIZE = 10_000


class Decision(enum.Enum):
    """What to do with an inbound event."""

    ALLOW = "allow"
    DENY = "deny"
    PAIR = "pair"


class Authorizer:
    """Allow/deny decisions for inbound events. Pairing approvals are cached for 30 s (``clock`` seconds), so a
    revoked approval stops working within that time."""

    def __init__(self, cfg: AuthSettings, pairing: PairingStore | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.pairing = pairing
        self.clock = clock
        self._admins = frozenset(cfg.admins)
        self._approved: OrderedDict[tuple[str, str], float] = OrderedDict()
        for platform, pa in cfg.platforms.items():
            if pa.allow_all:
                logger.warning("auth: %s allows every user (auth.platforms.%s.allow_all is true)", platform, platform)

    def is_admin(self, platform: str, user_id: str) -> bool:
        """Whether ``platform:user_id`` is listed in ``auth.admins``."""
        return f"{platform}:{user_id}" in self._admins

    def is_denied(self, event: MessageEvent) -> bool:
        """Whether the sender is on the platform's denylist."""
        pa = self.cfg.platforms.get(event.platform)
        return pa is not None and event.user_id in pa.denied_users

    async def _is_approved(self, platform: str, user_id: str) -> bool:
        if self.pairing is None:
            return False
        key = (platform, user_id)
        seen = self._approved.get(key)
        if seen is not None and self.clock() - seen < _APPROVED_CACHE_SECONDS:
            return True
        if not await self.pairing.is_approved(platform, user_id):
            self._approved.pop(key, None)
            return False
        self._approved[key] = self.clock()
        self._approved.move_to_end(key)
        while len(self._approved) > _APPROVED_CACHE_SIZE:
            self._approved.popitem(last=False)
        return True

    async def check(self, event: MessageEvent) -> Decision:
        """Allow, deny, or offer pairing."""
        if event.platform in SIGNED_PLATFORMS:
            return Decision.ALLOW
        if self.is_denied(event):
            return Decision.DENY
        if self.is_admin(event.platform, event.user_id):
            return Decision.ALLOW
        pa = self.cfg.platforms.get(event.platform)
        if pa is not None and (pa.allow_all or event.user_id in pa.allowed_users or event.chat_id in pa.allowed_chats):
            return Decision.ALLOW
        if await self._is_approved(event.platform, event.user_id):
            return Decision.ALLOW
        if self.cfg.dm_pairing and event.chat_type == "dm" and self.pairing is not None:
            return Decision.PAIR
        return Decision.DENY
