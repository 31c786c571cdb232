"""The one error of the media library, and the failures of a media endpoint (the ``openai`` client's) told as one."""

from __future__ import annotations

import re

import httpx2
import openai

from gateway.model_errors import exception_chain


class MediaError(Exception):
    """A file or a media endpoint could not be used; ``str()`` is one sentence fit to show the chat's user."""


_URL = re.compile(r"\w+://\S+")
_SAID_CHARS = 200


def endpoint_error(exc: openai.OpenAIError, service: str) -> MediaError:
    """``exc`` from the ``service`` endpoint ("transcription", "speech", "vision") as a ``MediaError``: the status
    and, for a refused request, the server's reason (URLs removed); never the key or the endpoint's address."""
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status in (401, 403):
            return MediaError(f"the {service} service refused the gateway's credentials (HTTP {status}).")
        if status == 404:
            return MediaError(f"the {service} service does not know the configured model (HTTP 404).")
        if status == 429:
            return MediaError(f"the {service} service is rate-limiting requests (HTTP 429); try again later.")
        if status >= 500:
            return MediaError(f"the {service} service failed (HTTP {status}); try again later.")
        said = exc.body.get("message") if isinstance(exc.body, dict) else None
        reason = _URL.sub("<url>", str(said))[:_SAID_CHARS] if said else "no reason given"
        return MediaError(f"the {service} service refused the request (HTTP {status}: {reason}).")
    # On the aiohttp transport a refused connection also surfaces as APITimeoutError; its cause tells them apart.
    unreachable = any(isinstance(e, ConnectionRefusedError | httpx2.ConnectError) for e in exception_chain(exc))
    if isinstance(exc, openai.APITimeoutError) and not unreachable:
        return MediaError(f"the {service} service did not answer in time; try again later.")
    if isinstance(exc, openai.APIConnectionError):
        return MediaError(f"the {service} service could not be reached; try again later.")
    return MediaError(f"the {service} service's answer could not be read.")
