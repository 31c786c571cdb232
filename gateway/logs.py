"""Logging setup: text or JSON lines, with secrets redacted from every record (tracebacks included)."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime

REDACTED = "[REDACTED]"

# Token shapes redacted even when they are not in the configuration: (pattern, replacement).
_TOKEN_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?<![0-9])\d{6,12}:[A-Za-z0-9_-]{30,}"), REDACTED),         # Telegram bot token
    (re.compile(r"xox[abprs]-[A-Za-z0-9-]{8,}"), REDACTED),             # Slack bot/user tokens
    (re.compile(r"xapp-[A-Za-z0-9-]{8,}"), REDACTED),                   # Slack app-level token
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), REDACTED),                 # OpenAI-style API keys
    (re.compile(r"whsec_[A-Za-z0-9+/=]{8,}"), REDACTED),                # Standard Webhooks secrets
    (re.compile(r"(/bot)[A-Za-z0-9:_-]{20,}"), r"\1" + REDACTED),          # token in a Bot API URL path
    (re.compile(r"(?i)(bearer\s+|\bbot\s+)[A-Za-z0-9._~+/=-]{12,}"), r"\1" + REDACTED),  # auth headers
    (re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"), REDACTED),        # JWTs
    (re.compile(r"""(?i)([?&](?:token|access_token|api_key|key|secret|signature)=)[^&\s#"']+"""), r"\1" + REDACTED),
]


class Redactor:
    """Replaces configured secrets and known token shapes with a marker."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: list[str] = []
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Also redact these exact values (short ones are ignored to avoid mangling text)."""
        merged = set(self._secrets) | {s for s in secrets if s and len(s) >= 6}
        self._secrets = sorted(merged, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        for pattern, replacement in _TOKEN_PATTERNS:
            text = pattern.sub(replacement, text)
        return text


redactor = Redactor()


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redactor(super().format(record))


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(), "level": record.levelname,
                 "logger": record.name, "msg": redactor(record.getMessage())}
        if record.exc_info:
            entry["exc"] = redactor(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Install one stderr handler on the root logger (replacing earlier ones)."""
    redactor.add(secrets)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else
                         _RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Request logs of the HTTP clients would print URLs that embed bot tokens.
    for noisy in ("httpx", "httpx2", "httpcore", "aiohttp.access", "telegram.ext.Updater"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
