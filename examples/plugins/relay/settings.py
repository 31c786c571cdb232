"""``platforms.relay``: the Relay platform's settings (pydantic only, so the tool sandbox can load the plugin)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


class RelaySettings(BaseModel):
    """``platforms.relay``: where the service is, the bot's token, how long one poll waits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, AfterValidator(_http_url)]
    token: SecretStr
    poll_timeout: float = Field(25.0, gt=0, le=30)
    request_timeout: float = Field(10.0, gt=0)
