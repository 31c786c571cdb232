"""Every sender kind end to end through the real HTTP server: GitHub (JSON and form-encoded), GitLab's token,
Svix's headers, the reference gateway's ``X-Webhook-Signature-V2``; a forged twin of each is refused with nothing
stored; bad input is a 400 naming the field; and interop with the ``standardwebhooks`` library both ways."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

from platforms.callback import CallbackAdapter, CallbackTarget
from platforms.webhook_signatures import MalformedDelivery, SignatureError, sign, verify

SECRET = "route-secret-0123456789abcdef"
WHSEC = "whsec_" + base64.b64encode(b"svix-route-key-0123456789abcdef").decode()
PAYLOAD = {"object_kind": "push", "ref": "refs/heads/main", "repository": {"full_name": "acme/rocket"},
           "pusher": {"name": "ada"}}
PROMPT = "Push to {payload.repository.full_name} by {payload.pusher.name}"
Headers = dict[str, str]


def _json(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def _form(payload: Any) -> bytes:
    return urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()


def _svix(secret: str, body: bytes) -> Headers:
    """Svix's header names around a signature from the ``standardwebhooks`` library."""
    msg_id, at = f"msg_{uuid.uuid4().hex}", datetime.now(UTC)
    return {"svix-id": msg_id, "svix-timestamp": str(int(at.timestamp())),
            "svix-signature": Webhook(secret).sign(msg_id, at, body)}


def _github(content_type: str) -> Callable[[str, bytes], Headers]:
    return lambda secret, body: {"Content-Type": content_type, "X-GitHub-Event": "push",
                                 **sign("github", secret, body)}


# sender: (route config, body encoder, headers for a secret and body, the secret, a wrong secret)
SENDERS: Mapping[str, tuple[dict[str, Any], Callable[[Any], bytes], Callable[[str, bytes], Headers], str, str]] = {
    "github-json": ({"scheme": "github"}, _json, _github("application/json"), SECRET, "wrong-" + SECRET),
    "github-form": ({"scheme": "github"}, _form,
                    _github("application/x-www-form-urlencoded"), SECRET, "wrong-" + SECRET),
    "gitlab": ({"scheme": "gitlab", "events": ["Push Hook"]}, _json,
               lambda secret, body: {"Content-Type": "application/json", **sign("gitlab", secret, body)},
               SECRET, "wrong-" + SECRET),
    "svix": ({"scheme": "standard-webhooks"}, _json,
             lambda secret, body: {"Content-Type": "application/json", **_svix(secret, body)},
             WHSEC, "whsec_" + base64.b64encode(b"someone-else-key-0123456789").decode()),
    "v2": ({"scheme": "hmac-sha256-v2"}, _json,
           lambda secret, body: {"Content-Type": "application/json", **sign("hmac-sha256-v2", secret, body)},
           SECRET, "wrong-" + SECRET),
}


def _config(route: Mapping[str, Any], secret: str, **routes: Any) -> dict[str, Any]:
    return {"platforms": {"webhook": {"routes": {
        "in": {"secret": secret, "prompt": PROMPT, "deliver_to": "none", **route}, **routes}}}}


async def _post(h: Any, route: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
    async with h.http.post(f"{h.base_url}/webhooks/{route}", data=body, headers=headers) as r:
        return r.status, await r.json()


async def _nothing_stored(h: Any) -> None:
    assert await h.gateway.store.count_inbox() == 0
    assert await h.gateway.store.count_runs() == 0
    assert h.model.requests == []


@pytest.mark.parametrize("sender", SENDERS)
async def test_each_sender_is_accepted_end_to_end_and_its_forged_twin_refused(make_gateway, sender: str) -> None:
    route, encode, headers, secret, wrong = SENDERS[sender]
    h = await make_gateway(_config(route, secret))
    body = encode(PAYLOAD)

    forged_secret = await _post(h, "in", body, headers(wrong, body))
    tampered = await _post(h, "in", body.replace(b"ada", b"eve"), headers(secret, body))
    assert forged_secret[0] == 401 and "invalid signature" in forged_secret[1]["error"]
    # GitLab signs nothing: a changed body under the genuine token passes (see the README); the others refuse it.
    assert tampered[0] == (202 if sender == "gitlab" else 401)
    if sender != "gitlab":
        await _nothing_stored(h)

    status, reply = await _post(h, "in", body, headers(secret, body))
    assert status == 202, reply
    run = await h.wait_run(reply["run_id"])
    assert run["status"] == "completed"
    prompts = [m["content"] for r in h.model.requests for m in r["messages"] if m["role"] == "user"]
    assert any(p.startswith("Push to acme/rocket by ada") for p in prompts)


async def test_a_github_form_delivery_and_its_json_twin_dedupe_by_their_own_signed_bodies(make_gateway) -> None:
    h = await make_gateway(_config({"scheme": "github"}, SECRET))
    form = _form(PAYLOAD)
    hdrs = {"Content-Type": "application/x-www-form-urlencoded", "X-GitHub-Event": "push",
            **sign("github", SECRET, form)}
    first = await _post(h, "in", form, hdrs)
    again = await _post(h, "in", form, {**hdrs, "X-GitHub-Delivery": "another-id"})
    assert (first[0], again[0]) == (202, 200) and again[1]["run_id"] == first[1]["run_id"]


@pytest.mark.parametrize(("body", "content_type", "error", "field"), [
    (b"zen=hi", "application/x-www-form-urlencoded", "form body has no payload field", "payload"),
    (b"", "application/x-www-form-urlencoded", "form body has no payload field", "payload"),
    (b"payload=%7B%22a%22%3A", "application/x-www-form-urlencoded", "form field payload is not valid JSON",
     "payload"),
    (b"payload=%7B%7D&payload=%7B%7D", "application/x-www-form-urlencoded",
     "form body must carry exactly one payload field", "payload"),
    (b"payload=%FF", "application/x-www-form-urlencoded", "form body is not valid URL-encoded UTF-8", "body"),
    (b"{not json", "application/json", "body is not valid UTF-8 JSON", "body"),
], ids=["no-payload", "empty", "bad-json", "two-payloads", "not-utf8", "json-body"])
async def test_a_signed_but_unreadable_body_is_400_naming_the_field(make_gateway, body: bytes, content_type: str,
                                                                      error: str, field: str) -> None:
    h = await make_gateway(_config({"scheme": "github"}, SECRET))
    hdrs = {"Content-Type": content_type, "X-GitHub-Event": "push", **sign("github", SECRET, body)}
    assert await _post(h, "in", body, hdrs) == (400, {"error": error, "field": field})
    await _nothing_stored(h)


@pytest.mark.parametrize("missing", ["X-Gitlab-Event", "X-Gitlab-Event-UUID"])
async def test_gitlab_without_its_event_headers_is_400_naming_the_header(make_gateway, missing: str) -> None:
    h = await make_gateway(_config({"scheme": "gitlab"}, SECRET))
    body = _json(PAYLOAD)
    hdrs = {k: v for k, v in sign("gitlab", SECRET, body).items() if k != missing}
    assert await _post(h, "in", body, hdrs) == (400, {"error": f"missing header {missing}", "field": missing})
    missing_token = {k: v for k, v in sign("gitlab", SECRET, body).items() if k != "X-Gitlab-Token"}
    assert (await _post(h, "in", body, missing_token))[0] == 401
    await _nothing_stored(h)


def test_gitlab_dedupes_by_event_uuid_and_body() -> None:
    body = _json(PAYLOAD)
    first = verify("gitlab", [SECRET], body, sign("gitlab", SECRET, body, delivery_id="u-1"))
    assert verify("gitlab", [SECRET], body, sign("gitlab", SECRET, body, delivery_id="u-1")) == first
    # A recursive hook shares the UUID with a different body: a different delivery. So does a new UUID.
    assert verify("gitlab", [SECRET], b"{}", sign("gitlab", SECRET, b"{}", delivery_id="u-1")).key != first.key
    assert verify("gitlab", [SECRET], body, sign("gitlab", SECRET, body, delivery_id="u-2")).key != first.key
    with pytest.raises(SignatureError, match="token mismatch"):
        verify("gitlab", ["other-token"], body, sign("gitlab", SECRET, body))
    with pytest.raises(MalformedDelivery):
        verify("gitlab", [SECRET], body, {"X-Gitlab-Token": SECRET})


def test_v2_matches_the_reference_string_to_sign_and_dedupes_replays_under_any_request_id() -> None:
    now, body = 1_700_000_000, b'{"a": 1}'
    headers = {"X-Webhook-Timestamp": str(now),
               "X-Webhook-Signature-V2": hmac.new(SECRET.encode(), f"{now}.".encode() + body,
                                                  hashlib.sha256).hexdigest(),
               "X-Request-ID": "r-1"}
    delivery = verify("hmac-sha256-v2", [SECRET], body, headers, now=now)
    assert delivery.id == "r-1"
    assert verify("hmac-sha256-v2", [SECRET], body, {**headers, "X-Request-ID": "r-2"}, now=now + 10).key \
        == delivery.key
    with pytest.raises(SignatureError, match="timestamp too old"):
        verify("hmac-sha256-v2", [SECRET], body, headers, now=now + 301)
    with pytest.raises(SignatureError, match="signature mismatch"):
        verify("hmac-sha256-v2", [SECRET], body, {**headers, "X-Webhook-Timestamp": str(now + 1)}, now=now)


def test_svix_headers_are_read_only_without_webhook_signature() -> None:
    body = _json(PAYLOAD)
    svix = _svix(WHSEC, body)
    assert verify("standard-webhooks", [WHSEC], body, svix).key == svix["svix-id"]
    # A webhook-signature present commits to the webhook-* names: svix-* cannot stand in for a missing one.
    with pytest.raises(SignatureError, match="missing header webhook-id"):
        verify("standard-webhooks", [WHSEC], body, {**svix, "webhook-signature": svix["svix-signature"]})


async def test_their_signer_is_accepted_by_our_verifier_over_http(make_gateway) -> None:
    h = await make_gateway(_config({"scheme": "standard-webhooks"}, WHSEC))
    body = _json(PAYLOAD)
    msg_id, at = "msg_interop_1", datetime.now(UTC)
    hdrs = {"Content-Type": "application/json", "webhook-id": msg_id,
            "webhook-timestamp": str(int(at.timestamp())), "webhook-signature": Webhook(WHSEC).sign(msg_id, at, body)}
    status, reply = await _post(h, "in", body, hdrs)
    assert status == 202, reply
    assert (await h.wait_run(reply["run_id"]))["status"] == "completed"
    tampered = await _post(h, "in", body.replace(b"ada", b"eve"), {**hdrs, "webhook-id": "msg_interop_2"})
    assert tampered[0] == 401


async def test_our_callback_signer_is_accepted_by_their_verifier() -> None:
    verified: list[Any] = []

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            verified.append(Webhook(WHSEC).verify(body, dict(request.headers)))
        except WebhookVerificationError as exc:
            return web.json_response({"error": str(exc)}, status=401)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/hook", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    adapter = CallbackAdapter({"them": CallbackTarget(f"http://127.0.0.1:{port}/hook", WHSEC, 5.0)})

    async def ignore(event: Any) -> None:
        return None

    await adapter.connect(ignore)
    try:
        sent = await adapter.send("them", "the answer ✓", metadata={"run_id": "r1", "delivery_id": "run:r1:0"})
        wrong = CallbackAdapter({"them": CallbackTarget(f"http://127.0.0.1:{port}/hook", SECRET + "-x", 5.0)})
        await wrong.connect(ignore)
        refused = await wrong.send("them", "forged", metadata={"run_id": "r2"})
        await wrong.disconnect()
    finally:
        await adapter.disconnect()
        await runner.cleanup()
    assert sent.success and not refused.success
    assert verified == [{"target": "them", "text": "the answer ✓", "run_id": "r1", "part": 0, "parts": 1}]
