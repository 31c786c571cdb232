"""Fuzzing ``POST /webhooks/{route}`` through one running gateway: random headers and bodies never get a
5xx, never break the server, and never reach the inbox without a valid signature.

Hypothesis and asyncio: the test is async, so the gateway (shared ``make_gateway`` harness) runs on the
test's own event loop. The ``@given`` function is plain sync code run in a worker thread
(``asyncio.to_thread``); each example submits its HTTP request and checks to that loop with
``asyncio.run_coroutine_threadsafe`` and blocks on the result. One gateway serves every example, the
loop is never blocked or nested, and a failing assertion surfaces in Hypothesis, which shrinks it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import string
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from platforms.webhook_signatures import sign

T = TypeVar("T")

LIMIT = 4096  # each fuzzed route's max_body_bytes
SCHEME = {"gh": "github", "std": "standard-webhooks", "hmac": "hmac-sha256"}  # route -> scheme
SECRET = {
    "gh": "fuzz-gh-secret-0123456789abcdef",
    "std": "whsec_" + base64.b64encode(b"fuzz-std-key-0123456789abcdef").decode(),
    "hmac": "fuzz-hmac-secret-0123456789abcdef",
}
CONFIG = {"platforms": {"webhook": {"routes": {
    route: {"secret": SECRET[route], "scheme": scheme, "prompt": "Fuzz {event}: {payload.title}",
            "deliver_to": "none", "max_body_bytes": LIMIT, "rate_limit_per_minute": 100_000}
    for route, scheme in SCHEME.items()}}}}
KNOWN_HEADERS = ("X-Hub-Signature-256", "X-GitHub-Delivery", "X-GitHub-Event", "webhook-id", "webhook-timestamp",
                 "webhook-signature", "X-Webhook-Signature", "X-Webhook-Timestamp", "X-Webhook-Id", "Content-Type")

_HEX = st.text("0123456789abcdefABCDEF", min_size=60, max_size=68)
_TIMESTAMP = st.one_of(
    st.integers(-300, 300).map(lambda skew: str(int(time.time()) + skew)),  # inside the tolerance window
    st.integers(-(10**40), 10**40).map(str),
    st.from_regex(r"[0-9]{1,5000}", fullmatch=True),
)
_HEADER_VALUE = st.one_of(
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=100),
    _HEX.map(lambda h: "sha256=" + h),
    _HEX,
    st.lists(st.binary(min_size=1, max_size=40).map(lambda b: "v1," + base64.b64encode(b).decode()),
             min_size=1, max_size=3).map(" ".join),
    _TIMESTAMP,
)
_HEADERS = st.dictionaries(
    st.sampled_from(KNOWN_HEADERS) | st.from_regex(r"X-Fuzz-[A-Za-z0-9-]{1,16}", fullmatch=True),
    _HEADER_VALUE, max_size=8)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["title", "type", "a"]) | st.text(),
                                                               inner, max_size=4),
    max_leaves=16)
_LONE_SURROGATE = st.tuples(st.text(), st.integers(0xD800, 0xDFFF), st.text()).map(
    lambda t: json.dumps({"title": t[0] + chr(t[1]) + t[2]}).encode())  # valid UTF-8 text, "\udXXX" inside
_OTHER_ENCODING = st.tuples(_JSON, st.sampled_from(["utf-16", "utf-32"])).map(
    lambda t: json.dumps(t[0], ensure_ascii=False).encode(t[1]))
# (kind, body); big bodies are built from a size so Hypothesis does not have to generate the bytes
_BODIES = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=512)),
    st.tuples(st.just("json"), _JSON.map(lambda v: json.dumps(v).encode())),
    st.tuples(st.just("not-utf8-json"), _LONE_SURROGATE | _OTHER_ENCODING),
    st.tuples(st.just("nested"), st.integers(1, LIMIT // 2).map(lambda d: b"[" * d + b"]" * d)),
    st.tuples(st.just("huge"), st.integers(LIMIT + 1, 4 * LIMIT).map(lambda n: b"{" * n)),
    st.tuples(st.just("empty"), st.just(b"")),
)


@dataclass(slots=True, frozen=True)
class _Delivery:
    route: str
    kind: str
    body: bytes
    headers: dict[str, str]
    signed: bool
    chunked: bool


@st.composite
def _deliveries(draw: st.DrawFn) -> _Delivery:
    route = draw(st.sampled_from([*SCHEME, "no-such-route"]))
    kind, body = draw(_BODIES)
    headers = draw(_HEADERS)
    signed = route in SCHEME and draw(st.booleans())
    if signed:  # random headers plus a genuine signature (fresh-looking id; a repeat is a duplicate)
        delivery_id = draw(st.text(string.ascii_letters + string.digits, min_size=1, max_size=24))
        headers = {**headers, **sign(SCHEME[route], SECRET[route], body, delivery_id=delivery_id)}
    return _Delivery(route, kind, body, headers, signed, draw(st.booleans()))


def _expected(d: _Delivery) -> set[int]:
    """The statuses the contract allows for a delivery, from how it was built."""
    if d.route not in SCHEME:
        return {404}
    if len(d.body) > LIMIT:
        return {413}
    if not d.signed:
        return {401}
    # 200 is a repeat of an earlier delivery id; random bytes are occasionally valid JSON (b"1"); nesting
    # deeper than the parser's recursion limit is refused
    return {"json": {200, 202}, "bytes": {200, 202, 400}, "nested": {200, 202, 400}, "not-utf8-json": {400},
            "empty": {400}}[d.kind]


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(body), 64):
        yield body[i:i + 64]
        await asyncio.sleep(0)


async def _check(h: Any, d: _Delivery) -> None:
    store = h.gateway.store
    before = await store.count_inbox()
    async with h.http.post(f"{h.base_url}/webhooks/{d.route}", headers=d.headers,
                           data=_chunks(d.body) if d.chunked else d.body) as r:
        status = r.status
        await r.read()
    assert status in _expected(d), (status, _expected(d))
    assert await store.count_inbox() == before + (status == 202)
    async with h.http.get(f"{h.base_url}/healthz") as r:
        assert r.status == 200


async def test_fuzzed_deliveries_never_5xx_and_never_reach_the_inbox_unsigned(make_gateway) -> None:
    h = await make_gateway(CONFIG)
    loop = asyncio.get_running_loop()

    def on_loop(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_deliveries())
    def check(delivery: _Delivery) -> None:
        on_loop(_check(h, delivery))

    await asyncio.wait_for(asyncio.to_thread(check), 240)
    async with h.http.get(f"{h.base_url}/healthz") as r:
        assert r.status == 200
