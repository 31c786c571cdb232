"""Why a model call failed, in words an operator can act on and a chat user can read.

The SDK's exception is often not the cause: on the aiohttp transport a refused connection, an unknown host or a
failed TLS handshake all surface as ``APITimeoutError("Request timed out.")``, with the real error further down
its chain (``__cause__``). ``explain`` walks that chain and names the config key to fix.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from typing import TypeVar
from urllib.parse import urlsplit

import httpx2
import openai

from gateway.config import ModelSettings


class ModelError(Exception):
    """The model could not be reached or refused; ``user_message`` is safe to show, ``str()`` is for the log."""

    def __init__(self, user_message: str, detail: str) -> None:
        super().__init__(detail)
        self.user_message = user_message


_E = TypeVar("_E", bound=BaseException)
_OPERATOR = "an operator needs to {}."
_UNREACHABLE = "I can't reach the model service{}. An operator needs to check model.base_url."
_TRANSIENT = ("I can't reach the model service{}. Please try again in a moment; if this persists, "
              "an operator needs to check model.base_url.")


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes (``__cause__``, else ``__context__``), outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _find(exc: BaseException, kind: type[_E]) -> _E | None:
    return next((e for e in exception_chain(exc) if isinstance(e, kind)), None)


def _innermost(exc: BaseException) -> str:
    *_, last = exception_chain(exc)
    text = str(last)
    return f"{type(last).__name__}: {text}" if text else type(last).__name__


def _address(cfg: ModelSettings) -> str:
    parts = urlsplit(cfg.base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def _status_error(exc: openai.APIStatusError, cfg: ModelSettings) -> ModelError:
    status = exc.status_code
    said = str(exc.body.get("message") or "") if isinstance(exc.body, dict) else ""
    where = f"{type(exc).__name__}, HTTP {status} from {cfg.base_url}/chat/completions" + (f": {said}" if said else "")
    if status == 401:
        return ModelError("The model service rejected the gateway's API key; " + _OPERATOR.format("fix model.api_key"),
                          f"the API key was rejected ({where}); check model.api_key")
    if status == 403:
        return ModelError("The model service refused the gateway access; "
                          + _OPERATOR.format("check model.api_key and model.name"),
                          f"access refused ({where}); check that model.api_key may use model {cfg.name!r}")
    if status == 404:
        if exc.code == "model_not_found" or "model" in said.lower():
            return ModelError("The configured model does not exist at the model service; "
                              + _OPERATOR.format("fix model.name"),
                              f"model {cfg.name!r} not found ({where}); check model.name")
        return ModelError("The model service's address is wrong; " + _OPERATOR.format("fix model.base_url"),
                          f"no chat completions endpoint at {cfg.base_url} ({where}); check model.base_url "
                          "(OpenAI-compatible servers usually serve it under /v1)")
    if status == 429:
        if exc.code == "insufficient_quota":
            return ModelError("The model service account is out of quota; "
                              + _OPERATOR.format("check the account of model.api_key"),
                              f"quota exhausted ({where}); check the account of model.api_key")
        return ModelError("The model service is rate-limiting us. Please try again in a minute.",
                          f"rate-limited ({where})")
    if status >= 500:
        return ModelError("The model service had an internal error. Please try again in a moment.",
                          f"the service failed ({where})")
    return ModelError("The model request failed. Please try again or rephrase.",
                      f"the request was refused ({where})")


def _connection_error(exc: openai.APIConnectionError, cfg: ModelSettings) -> ModelError:
    address, url, cause = _address(cfg), cfg.base_url, _innermost(exc)
    if _find(exc, ssl.SSLCertVerificationError) is not None:
        return ModelError(_UNREACHABLE.format(": its TLS certificate is not trusted"),
                          f"the TLS certificate of {address} is not trusted ({cause}); check model.base_url "
                          f"{url}, or give the server a certificate this machine trusts")
    if (tls := _find(exc, ssl.SSLError)) is not None:
        hint = " (is it plain HTTP? then use http://)" if "WRONG_VERSION_NUMBER" in str(tls) else ""
        return ModelError(_UNREACHABLE.format(": the secure connection failed"),
                          f"TLS handshake with {address} failed{hint} ({cause}); check model.base_url {url}")
    if _find(exc, socket.gaierror) is not None:
        host = urlsplit(url).hostname
        return ModelError(_UNREACHABLE.format(": its host name does not resolve"),
                          f"host {host!r} does not resolve ({cause}); check model.base_url {url}")
    if _find(exc, ConnectionRefusedError) is not None:
        return ModelError(_TRANSIENT.format(": the connection was refused"),
                          f"connection refused by {address}: nothing listens there; check model.base_url "
                          f"{url} and that the model server runs")
    if _find(exc, httpx2.ConnectTimeout) is not None or _find(exc, httpx2.ConnectError) is not None:
        # Not one of the causes above: a connect timeout, or another OS error (no route to host, ...).
        os_error = next((e for e in exception_chain(exc) if isinstance(e, OSError) and not isinstance(e, TimeoutError)
                         and e.errno is not None), None)
        detail = (f"cannot connect to {address} ({os_error.strerror})" if os_error is not None
                  else f"no connection to {address} within model.connect_timeout ({cfg.connect_timeout:g} s)")
        return ModelError(_TRANSIENT.format(""), f"{detail}; check model.base_url {url} and the network")
    if isinstance(exc, openai.APITimeoutError):
        return ModelError("The model did not answer in time. Please try again in a moment.",
                          f"no answer from {address} within model.timeout ({cfg.timeout:g} s)")
    # Connected, then the connection failed (the server closed it mid-answer, a proxy cut it, ...).
    return ModelError("The connection to the model service broke off. Please try again in a moment.",
                      f"the connection to {address} failed during the request ({cause})")


def explain(exc: openai.OpenAIError, cfg: ModelSettings) -> ModelError:
    """A ``ModelError`` naming the real cause of ``exc`` and the config key to fix."""
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc, cfg)
    if isinstance(exc, openai.APIConnectionError):
        return _connection_error(exc, cfg)
    return ModelError("The model request failed. Please try again or rephrase.", f"{type(exc).__name__}: {exc}")
