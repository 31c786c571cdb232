"""Replay-safe dedupe over HTTP, through a real gateway: every scheme's dedupe key is bound to signed content.

A captured request sent again under a new unsigned id makes no second run; a forged id cannot make a later
genuine delivery look like a duplicate; GitHub's unsigned event header cannot carry a payload past a route's
filter. Time is the adapter's clock (and the signed timestamps), never a sleep.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from platforms.webhook_signatures import sign

SECRET = "replay-route-secret-0123456789abcdef"
WINDOW = 3600
T0 = 1_800_000_000 // WINDOW * WINDOW  # the start of a GitHub replay window
ISSUE = {"action": "opened", "issue": {"number": 7, "title": "Launch slips"}, "repository": {"full_name": "a/r"}}
COMMENT = {"action": "created", "issue": {"number": 7}, "comment": {"id": 9, "body": "ship it"},
           "repository": {"full_name": "a/r"}}


def _config(**routes: Mapping[str, Any]) -> dict[str, Any]:
    return {"platforms": {"webhook": {"routes": {
        name: {"secret": SECRET, "prompt": "{event}: {payload.action}", "deliver_to": "none", **route}
        for name, route in routes.items()}}}}


def _body(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def _unsigned_id(body: bytes, timestamp: int, msg_id: str | None) -> dict[str, str]:
    """An hmac-sha256 sender that signs ``"<timestamp>." + body`` and sends its id unsigned."""
    digest = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Webhook-Signature": digest, "X-Webhook-Timestamp": str(timestamp),
            **({"X-Webhook-Id": msg_id} if msg_id else {})}


async def _post(h: Any, route: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
    async with h.http.post(f"{h.base_url}/webhooks/{route}", data=body,
                           headers={"Content-Type": "application/json", **headers}) as r:
        return r.status, await r.json()


def _at(h: Any, now: float) -> None:
    h.gateway.adapters["webhook"].clock = lambda: now


async def _runs(h: Any) -> int:
    return await h.gateway.store.count_runs()


async def test_hmac_sha256_replay_under_a_new_unsigned_id_creates_no_second_run(make_gateway) -> None:
    h = await make_gateway(_config(hmac={"scheme": "hmac-sha256"}))
    body = _body(ISSUE)
    genuine = sign("hmac-sha256", SECRET, body, delivery_id="evt-1")
    status, first = await _post(h, "hmac", body, genuine)
    assert status == 202
    for new_id in ("evt-2", ""):  # the captured request under another id, or none
        replay = {**genuine, "X-Webhook-Id": new_id}
        assert (await _post(h, "hmac", body, replay))[0] == 401
    assert await _post(h, "hmac", body, genuine) == (200, {"run_id": first["run_id"], "duplicate": True})
    assert await _runs(h) == 1


async def test_a_forged_id_cannot_pre_empt_the_genuine_delivery(make_gateway) -> None:
    """The attacker holds a captured request and knows the id of the next one; its forgery is refused (or, with
    the compatibility option, keyed by its own body), so the genuine delivery still makes its run."""
    h = await make_gateway(_config(hmac={"scheme": "hmac-sha256"},
                                   compat={"scheme": "hmac-sha256", "allow_unsigned_id": True}))
    captured_body, next_body = _body(ISSUE), _body(COMMENT)
    captured = sign("hmac-sha256", SECRET, captured_body, delivery_id="evt-1")
    assert (await _post(h, "hmac", captured_body, captured))[0] == 202
    forged = {**captured, "X-Webhook-Id": "evt-2"}
    assert (await _post(h, "hmac", captured_body, forged))[0] == 401
    status, reply = await _post(h, "hmac", next_body, sign("hmac-sha256", SECRET, next_body, delivery_id="evt-2"))
    assert (status, reply["duplicate"]) == (202, False)

    old_sender = _unsigned_id(captured_body, int(h.gateway.adapters["webhook"].clock()), "evt-2")
    assert (await _post(h, "compat", captured_body, old_sender))[0] == 202  # the id is ignored, not taken
    status, reply = await _post(h, "compat", next_body,
                                sign("hmac-sha256", SECRET, next_body, delivery_id="evt-2"))
    assert (status, reply["duplicate"]) == (202, False)
    assert await _runs(h) == 4


async def test_compatibility_option_dedupes_unsigned_id_senders_by_body_within_the_tolerance_window(
        make_gateway) -> None:
    h = await make_gateway(_config(hmac={"scheme": "hmac-sha256"},
                                   compat={"scheme": "hmac-sha256", "allow_unsigned_id": True,
                                           "tolerance_seconds": 300}))
    start = T0 + 600  # a multiple of 300: the start of a tolerance window
    body = _body(ISSUE)
    _at(h, start + 10)
    headers = _unsigned_id(body, start + 10, "evt-1")
    assert (await _post(h, "hmac", body, headers))[0] == 401  # without the option the id must be signed
    status, first = await _post(h, "compat", body, headers)
    assert status == 202
    duplicate = (200, {"run_id": first["run_id"], "duplicate": True})
    # a replay under new ids (or none), up to the end of its timestamp's tolerance; at +200 the sender's own
    # retry, signed again within the same window, is the same delivery too
    for at, signed_at, new_id in ((start + 11, start + 10, "evt-2"), (start + 200, start + 200, "evt-1"),
                                  (start + 300, start + 10, "evt-3"), (start + 310, start + 10, None)):
        _at(h, at)
        assert await _post(h, "compat", body, _unsigned_id(body, signed_at, new_id)) == duplicate
    _at(h, start + 311)
    assert (await _post(h, "compat", body, _unsigned_id(body, start + 10, "evt-4")))[0] == 401  # too old
    assert await _runs(h) == 1


async def test_compatibility_option_identical_body_runs_again_after_the_window(make_gateway) -> None:
    h = await make_gateway(_config(compat={"scheme": "hmac-sha256", "allow_unsigned_id": True,
                                           "tolerance_seconds": 300}))
    body = _body(ISSUE)
    _at(h, T0 + 299)
    assert (await _post(h, "compat", body, _unsigned_id(body, T0 + 299, None)))[0] == 202
    _at(h, T0 + 300)
    status, reply = await _post(h, "compat", body, _unsigned_id(body, T0 + 300, None))
    assert (status, reply["duplicate"]) == (202, False)
    assert await _runs(h) == 2


async def test_github_replay_under_a_new_delivery_id_within_the_window_creates_no_second_run(make_gateway) -> None:
    h = await make_gateway(_config(gh={"scheme": "github", "replay_window_seconds": WINDOW}))
    body = _body(ISSUE)
    headers = {"X-GitHub-Event": "issues", **sign("github", SECRET, body, delivery_id="d-1")}
    _at(h, T0)
    status, first = await _post(h, "gh", body, headers)
    assert status == 202
    for at, delivery in ((T0 + 1, "d-2"), (T0 + 60, "d-1"), (T0 + WINDOW - 1, "d-3")):
        _at(h, at)
        replay = {**headers, "X-GitHub-Delivery": delivery}
        assert await _post(h, "gh", body, replay) == (200, {"run_id": first["run_id"], "duplicate": True})
    assert await _runs(h) == 1
    # another body is another delivery
    other = _body({**ISSUE, "action": "closed"})
    status, reply = await _post(h, "gh", other, {"X-GitHub-Event": "issues", **sign("github", SECRET, other,
                                                                                    delivery_id="d-9")})
    assert (status, reply["duplicate"]) == (202, False)


async def test_github_body_window_slides_and_delivery_ids_dedupe_beyond_it(make_gateway) -> None:
    """The body's window is measured back from each delivery (no fixed slots to replay across); GitHub's own
    redelivery of a delivery id stays a duplicate after the window."""
    h = await make_gateway(_config(gh={"scheme": "github", "replay_window_seconds": WINDOW}))
    body = _body(ISSUE)

    def signed(delivery: str) -> dict[str, str]:
        return {"X-GitHub-Event": "issues", **sign("github", SECRET, body, delivery_id=delivery)}

    _at(h, T0 + WINDOW - 1)  # the end of what a fixed slot would be
    status, first = await _post(h, "gh", body, signed("d-1"))
    assert status == 202
    _at(h, T0 + WINDOW + 1)  # a fixed slot would have started again here
    assert await _post(h, "gh", body, signed("d-2")) == (200, {"run_id": first["run_id"], "duplicate": True})
    _at(h, T0 + 2 * WINDOW)  # more than the window after the first
    status, second = await _post(h, "gh", body, signed("d-3"))
    assert (status, second["duplicate"]) == (202, False)
    _at(h, T0 + 10 * WINDOW)
    assert await _post(h, "gh", body, signed("d-1")) == (200, {"run_id": first["run_id"], "duplicate": True})
    assert await _runs(h) == 2


async def test_a_swapped_github_event_header_does_not_pass_the_filter(make_gateway) -> None:
    h = await make_gateway(_config(gh={"scheme": "github", "events": ["issues"]}))
    comment = _body(COMMENT)
    signed = sign("github", SECRET, comment)
    assert await _post(h, "gh", comment, {"X-GitHub-Event": "issue_comment", **signed}) == (
        200, {"ignored": True, "event": "issue_comment.created"})
    for swapped in ("issues", "issues.opened"):
        reply = await _post(h, "gh", comment, {"X-GitHub-Event": swapped, **signed})
        mismatch = {"error": "X-GitHub-Event does not match the payload", "field": "X-GitHub-Event"}
        assert reply == (400, mismatch), swapped
    push = _body({"ref": "refs/heads/main", "pusher": {"name": "ana"}, "commits": []})
    assert (await _post(h, "gh", push, {"X-GitHub-Event": "issues", **sign("github", SECRET, push)}))[0] == 400
    assert await h.gateway.store.count_inbox() == 0
    issue = _body(ISSUE)
    assert (await _post(h, "gh", issue, {"X-GitHub-Event": "issues", **sign("github", SECRET, issue)}))[0] == 202
