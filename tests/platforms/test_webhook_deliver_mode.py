"""``mode: deliver`` routes: the rendered template is delivered with no model call, through the inbox and the
outbox (exactly once, a redelivery included), and recorded as a run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.config import ConfigError, parse_config
from tests.conftest import WEBHOOK_SECRET

RELAY = {"mode": "deliver", "template": "CI {payload.build.status} for {payload.repository.full_name} ({event})",
         "deliver_to": "callback:sink"}


async def test_a_deliver_route_relays_its_template_once_without_the_model(make_gateway) -> None:
    h = await make_gateway({"platforms": {"webhook": {"routes": {"relay": {"secret": WEBHOOK_SECRET, **RELAY}}}}})
    payload = {"repository": {"full_name": "acme/rocket"}, "build": {"status": "passed <<<"}}

    status, reply = await h.post_webhook(payload, route="relay", event="workflow_job")
    # A redelivery: the same signed body.
    again_status, again = await h.post_webhook(payload, route="relay", event="workflow_job")
    assert (status, again_status) == (202, 200) and again["run_id"] == reply["run_id"]

    run = await h.wait_run(reply["run_id"])
    received = await h.sink.wait_for(1)
    await asyncio.sleep(0.3)  # a second delivery would have arrived by now
    assert [r["text"] for r in h.sink.received] == ["CI passed <<< for acme/rocket (workflow_job)"]
    assert received[0]["run_id"] == reply["run_id"]
    assert h.model.requests == []
    assert (run["status"], run["kind"], run["ended_by"], run["model_calls"]) == (
        "completed", "webhook", "delivered", 0)
    assert run["result"] == "CI passed <<< for acme/rocket (workflow_job)"


def _route(**settings: Any) -> dict[str, Any]:
    return {"platforms": {"webhook": {"routes": {"ci": {"secret": "s3cret-0123456789", **settings}}}}}


@pytest.mark.parametrize(("settings", "message"), [
    ({"mode": "deliver", "deliver_to": "callback:x"}, "template: required with mode: deliver"),
    ({**RELAY, "deliver_to": "none"}, "deliver_to: required with mode: deliver"),
    ({**RELAY, "prompt": "p"}, "prompt: not used with mode: deliver"),
    ({**RELAY, "toolset": "web"}, "toolset: not used with mode: deliver"),
    ({"template": "t", "prompt": "p"}, "template: not used with mode: agent"),
    ({"deliver_to": "none"}, "prompt: required with mode: agent"),
])
def test_mode_settings_are_checked_at_load(settings: dict[str, Any], message: str) -> None:
    config = _route(**settings)
    config["platforms"]["callback"] = {"targets": {"sink": {"url": "http://127.0.0.1:9/", "secret": "x" * 16},
                                                   "x": {"url": "http://127.0.0.1:9/", "secret": "x" * 16}}}
    with pytest.raises(ConfigError, match=message):
        parse_config(config, env={})
