"""Secret hygiene: no secret shape survives into logs, tool results or stored errors."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import re
import string
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import logs
from gateway.logs import REDACTED, Redactor, redactor, setup_logging
from gateway.sim.model_server import rules, tool_call
from tools.registry import ISOLATION_PROCESS, registry
from toolsets import TOOLSETS, create_custom_toolset

SECRETS = {
    "telegram": "123456789:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0",
    "slack_bot": "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx",
    "slack_app": "xapp-1-A0123456789-1234567890123-abcdef0123456789",
    "openai": "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
    "whsec": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "bearer": "Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig",
    "configured": "plain-configured-secret-value",
}


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Root logging at DEBUG into a buffer, through the gateway's formatter."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()
    setup_logging("DEBUG", "text", [SECRETS["configured"]])
    root.handlers[0].stream = buf  # type: ignore[attr-defined]
    yield buf
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_each_secret_shape_is_redacted_in_messages_args_urls_and_tracebacks(fmt: str, captured: io.StringIO) -> None:
    if fmt == "json":
        setup_logging("DEBUG", "json")
        logging.getLogger().handlers[0].stream = captured  # type: ignore[attr-defined]
    log = logging.getLogger("platform.test")
    for name, secret in SECRETS.items():
        log.debug("calling %s with %s", name, secret)
        log.debug("GET https://api.example.com/bot%s/getMe?token=%s", secret, secret)
        try:
            raise RuntimeError(f"request failed: Authorization: {secret}")
        except RuntimeError:
            log.exception("failure for %s", name)
    out = captured.getvalue()
    assert REDACTED in out
    for name, secret in SECRETS.items():
        core = secret.split()[-1]
        assert core not in out, f"{name} leaked"
    if fmt == "json":
        assert all(json.loads(line)["level"] for line in out.splitlines() if line.startswith("{"))


def test_redactor_keeps_ordinary_text() -> None:
    r = Redactor(["abcdefghij"])
    text = "The build took 12:34 and 100% of 1234567 tests passed; see https://x.org/a?page=2"
    assert r(text) == text
    assert r("short ok") == "short ok"


async def test_tool_results_and_run_errors_are_redacted_before_storage(make_gateway) -> None:
    leaky = "sk-live-0123456789abcdefghijklmnop"

    def leak(args: dict, **ctx: object) -> str:
        return f"config dump: OPENAI_API_KEY={leaky} bot=123456789:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0"

    registry.register("leaky_tool", "test-leaky", {"name": "leaky_tool", "description": "leaks",
                                                   "parameters": {"type": "object", "properties": {}}}, leak,
                      isolation=ISOLATION_PROCESS)  # defined here, so it runs here (no sandbox worker knows it)
    create_custom_toolset("test-leaky", "", ["leaky_tool"])
    try:
        h = await make_gateway({"toolsets": {"telegram": "test-leaky"}},
                               responder=rules((r"dump", tool_call("leaky_tool", {}))))
        await h.chat.user_says("dump the config")
        await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
        # what the model saw after the tool call
        tool_msg = next(m for m in h.model.requests[-1]["messages"] if m["role"] == "tool")["content"]
        assert leaky not in tool_msg and "AAHfiqks" not in tool_msg and REDACTED in tool_msg
        # what was stored
        run = (await h.gateway.store.list_runs())[0]
        assert leaky not in json.dumps(run.tool_calls)
        history = await h.gateway.store.history("telegram:dm:100", 0, 50)
        assert all(leaky not in (m.content or "") for m in history)
        assert leaky not in h.chat.sent[0].text
    finally:
        registry.deregister("leaky_tool")
        TOOLSETS.pop("test-leaky", None)
        redactor.add(())


# -- encoded forms of configured secrets -----------------------------------------

ENCODED_SECRETS = [
    "plain-configured-secret-value",
    "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
    "p@ss w/rd+&=?%~\"quoted\\ é ünï",
    "Zx9-Qw8_Er7+Ty6/Ui5=",
]


def _squeeze(text: str) -> str:
    return "".join(text.split())


def _stable_base64(stream: bytes, start: int, secret: bytes) -> str:
    """The characters of ``stream``'s base64 made only of the secret's bits (it starts ``start`` bytes in)."""
    encoded = base64.b64encode(stream).decode()
    return encoded[-(-start * 8 // 6):(start + len(secret)) * 8 // 6]


def _wrap(text: str, width: int, newline: str = "\n") -> str:
    return newline.join(text[i:i + width] for i in range(0, len(text), width))


@pytest.mark.parametrize("secret", ENCODED_SECRETS)
@pytest.mark.parametrize("before", [b"", b"x", b"xy", b"header bytes\x00\xff", b"0123456789abcdef!"])
def test_base64_of_a_secret_inside_a_longer_stream_is_redacted(secret: str, before: bytes) -> None:
    r = Redactor([secret])
    data = secret.encode()
    for after in (b"", b"!", b"trailing bytes \x01\x02"):
        stream = before + data + after
        core = _stable_base64(stream, len(before), data)
        standard = base64.b64encode(stream).decode()
        encodings = {
            "standard": standard,
            "unpadded": standard.rstrip("="),
            "urlsafe": base64.urlsafe_b64encode(stream).decode(),
            "base64 tool (76 columns)": base64.encodebytes(stream).decode(),
            "CRLF wrapped at 64": _wrap(standard, 64, "\r\n"),
            "JSON string of the wrapped output": json.dumps(base64.encodebytes(stream).decode()),
            "indented": _wrap(standard, 20, "\n        "),
        }
        for name, encoded in encodings.items():
            out = r(f"here it is: {encoded} (end)")
            assert out.startswith("here it is: ") and out.endswith(" (end)"), (name, out)
            squeezed = _squeeze(out).replace("\\n", "")
            assert core.translate(str.maketrans("+/", "-_")) not in squeezed and core not in squeezed, (name, out)
            assert REDACTED in out


@pytest.mark.parametrize("secret", ENCODED_SECRETS)
def test_hex_and_percent_and_json_forms_of_a_secret_are_redacted(secret: str) -> None:
    r = Redactor([secret])
    data = secret.encode()
    forms = {
        "hex": data.hex(),
        "HEX": data.hex().upper(),
        "xxd -p (60 columns)": _wrap(data.hex(), 60),
        "od -An -tx1": _wrap(" ".join(f"{b:02x}" for b in data), 48, "\n "),
        "hex in a longer dump": "00ff" + data.hex() + "ee",
        "quote": quote(secret, safe=""),
        "quote lower-case escapes": re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(secret, safe="")),
        "quote_plus": quote_plus(secret),
        "JSON": json.dumps(secret)[1:-1],
        "plain": secret,
    }
    for name, form in forms.items():
        out = r(f"value={form};")
        assert out in (f"value={REDACTED};", f"value=00ff{REDACTED}ee;"), (name, form, out)


@settings(max_examples=60, deadline=None)
@given(secret=st.text(min_size=8, max_size=40).filter(lambda s: s.strip() == s and "\x00" not in s),
       before=st.binary(max_size=5), after=st.binary(max_size=5), wrap=st.sampled_from([0, 4, 76]))
def test_any_secret_in_any_base64_alignment_is_redacted(secret: str, before: bytes, after: bytes, wrap: int) -> None:
    data = secret.encode("utf-8", errors="surrogatepass")
    stream = before + data + after
    encoded = base64.b64encode(stream).decode()
    out = Redactor([secret])("<<" + (_wrap(encoded, wrap) if wrap else encoded) + ">>")
    core = _stable_base64(stream, len(before), data)
    assert core not in _squeeze(out)
    assert REDACTED in out


@given(text=st.text(alphabet=string.ascii_letters + string.digits + " \n+/=-_%.:,", max_size=300))
def test_text_without_the_secret_is_unchanged(text: str) -> None:
    r = Redactor(ENCODED_SECRETS)
    assert r(text) == text or any(p.search(text.encode()) for p, _ in logs._TOKEN_PATTERNS)


def test_ordinary_text_with_other_encodings_is_unchanged() -> None:
    r = Redactor(ENCODED_SECRETS)
    text = ("commit 4f2a9c1e0b7d3e5f6a8b9c0d1e2f3a4b5c6d7e8f; sha256 " + hashlib.sha256(b"x").hexdigest() + "\n"
            + base64.encodebytes(b"some other payload " * 10).decode()
            + "see https://example.org/search?q=hello%20world&page=2 and 12:34 and 1234567 tests")
    assert r(text) == text


def test_short_secrets_and_short_encodings_are_ignored() -> None:
    r = Redactor(["abc12", "", "zz"])
    text = "abc12 " + base64.b64encode(b"abc12").decode() + " " + b"abc12".hex() + " zz"
    assert r(text) == text
    six = Redactor(["k3y-42"])  # six characters: redacted plain, and in the encodings long enough to be unique
    assert six("a k3y-42 b") == f"a {REDACTED} b"
    assert REDACTED in six(base64.b64encode(b"k3y-42").decode())


def test_secrets_added_later_are_redacted_in_every_form() -> None:
    r = Redactor()
    secret = "added-later-secret-42"
    assert r(secret) == secret
    r.add([secret])
    r.add([])  # nothing new: the patterns are kept
    assert r(base64.b64encode(secret.encode()).decode()) == REDACTED
    assert r(secret.encode().hex()) == REDACTED


def test_text_that_is_not_valid_unicode_is_redacted_not_rejected() -> None:
    r = Redactor(["plain-configured-secret-value"])
    name = os.fsdecode(b"caf\xe9-plain-configured-secret-value")
    assert r(name) == os.fsdecode(b"caf\xe9-") + REDACTED


@pytest.mark.parametrize("token", ["123456789:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0"])
def test_telegram_token_needs_no_digit_before_it(token: str) -> None:
    r = Redactor()
    assert r(token) == REDACTED
    assert r(f"bot{token} x") == f"bot{REDACTED} x"
    assert r(f"a:{token}\n{token}") == f"a:{REDACTED}\n{REDACTED}"
    assert r(f"1234{token}") == f"1234{token}"  # a longer number is not a token


_REDACT_IN_SUBPROCESS = """
import sys
from gateway.logs import Redactor
print(len(Redactor(["plain-configured-secret-value"])(sys.stdin.read())))
"""


@pytest.mark.parametrize("hostile", ["eyJ" * 200_000, "bearer " * 100_000, "1234567:" * 100_000])
def test_token_patterns_take_linear_time(hostile: str) -> None:
    repo = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run([sys.executable, "-c", _REDACT_IN_SUBPROCESS], input=hostile, cwd=repo,
                              capture_output=True, text=True, timeout=60, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"redacting {hostile[:12]!r}... took more than 60 s (backtracking patterns?)")
    assert int(done.stdout) > 0


def test_unfinished_text_never_shows_the_start_of_a_secret() -> None:
    """A streamed answer, redacted at every length as the preview shows it."""
    secret = "sk-proj-abcdefghijklmnopqrstuvwxyz012345"
    r = Redactor([secret])
    encoded = base64.encodebytes(b"config=" + secret.encode() + b"\n").decode()
    core = _stable_base64(b"config=" + secret.encode(), 7, secret.encode())
    answer = f"Here is the file, base64-encoded:\n\n{encoded}\nAnything else? And the raw key: {secret} ok"
    for end in range(1, len(answer) + 1):
        shown = _squeeze(r.redact_unfinished(answer[:end]))
        assert not any(core[i:i + 10] in shown for i in range(len(core) - 9)), answer[:end]
        assert not any(secret[i:i + 10] in shown for i in range(len(secret) - 9)), answer[:end]
    assert r.redact_unfinished(answer) == r(answer).removesuffix("ok")
    assert r.redact_unfinished("Hello wor") == "Hello "
