"""Talking to the running gateway over HTTP from the command line (``status``, ``webhook send``).

The standard library's urllib: the CLI needs a request or two, not a client library's import time.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from gateway.cli.common import CliError

if TYPE_CHECKING:
    from gateway.config import HttpConfig

TIMEOUT_SECONDS = 5.0
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}


def base_url(http: HttpConfig, override: str | None) -> str:
    """The gateway's URL: ``override`` (``--url``), else the config's http.host and http.port."""
    if override:
        return override.rstrip("/")
    if not http.port:
        raise CliError("http.port is 0 in the config (a port chosen at start): pass --url", 2)
    host = _LOOPBACK.get(http.host, f"[{http.host}]" if ":" in http.host else http.host)
    return f"http://{host}:{http.port}"


def request_json(url: str, *, token: str | None = None, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """GET (or POST ``body``) and read a JSON answer: (HTTP status, body). CliError when nothing answers."""
    import urllib.error  # http.client and email: 40 ms that --help need not pay
    import urllib.request

    sent = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=body, headers=sent, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:  # 401, 503: still the gateway's answer
        with exc:
            try:
                return exc.code, json.load(exc)
            except ValueError:
                return exc.code, {}
    except OSError as exc:  # refused, unreachable, timed out (URLError is one)
        reason = getattr(exc, "reason", exc)
        raise CliError(f"no gateway answered at {'/'.join(url.split('/', 3)[:3])} ({reason}); is it running? "
                       "(--url points elsewhere)") from None
    except ValueError:
        raise CliError(f"{url} did not answer with JSON: is that a hermes-gateway?") from None
