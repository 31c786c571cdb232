"""Property tests: prompt rendering and event filtering never raise, and the untrusted fence holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from platforms.webhook import UNTRUSTED_CLOSE, UNTRUSTED_OPEN, WebhookRoute, event_allowed, event_name, render_prompt

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=15)
_templates = st.lists(st.one_of(st.text(max_size=20), st.builds(
    lambda path: "{payload" + "".join("." + p for p in path) + "}",
    st.lists(st.text("abcxyz019_-", min_size=1, max_size=5), max_size=4)), st.just("{event}"), st.just("{route}")),
    max_size=6).map("".join)


@settings(max_examples=300, deadline=None)
@given(template=_templates, payload=_json, event=st.text(max_size=30))
def test_render_never_raises_and_keeps_one_fence(template: str, payload: object, event: str) -> None:
    out = render_prompt(template, payload, event, "route")
    assert out.count(UNTRUSTED_OPEN) == 1 and out.count(UNTRUSTED_CLOSE) == 1
    assert out.endswith(UNTRUSTED_CLOSE)


@settings(max_examples=200, deadline=None)
@given(payload=_json, header=st.text(max_size=20), events=st.lists(st.text(max_size=10), max_size=3),
       scheme=st.sampled_from(["github", "standard-webhooks", "hmac-sha256"]))
def test_event_name_and_filter_never_raise(payload: object, header: str, events: list[str], scheme: str) -> None:
    route = WebhookRoute("r", ("secret",), scheme, "p", events=tuple(events))
    name = event_name(route, {"X-GitHub-Event": header}, payload)
    assert isinstance(name, str)
    assert event_allowed(route, name) is (not events or any(name == e or name.startswith(e + ".") for e in events))
