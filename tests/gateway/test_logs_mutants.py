"""Redaction rules that ``make mutate`` found unpinned: each test names the mutants of ``gateway/logs.py`` it
kills."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import re2

import gateway.logs as logs
from gateway.logs import REDACTED, Redactor


def _secrets(n: int, length: int = 40) -> list[str]:
    return [f"secret-{i:03d}-" + "q" * (length - 11) for i in range(n)]


def test_secrets_past_one_batch_are_all_redacted() -> None:
    """Kills _compile's ``batches = _batches(...)`` (only the last batch kept), ``batches -= ...``,
    ``_batches(None)``, ``list(None)`` and ``pending = None`` (40 secrets' forms outgrow one RE2 pattern)."""
    secrets = _secrets(40)
    redact = Redactor(secrets)
    assert len(redact._patterns.batches) > 1
    for secret in secrets:
        assert redact(f"key={secret};") == f"key={REDACTED};"


def test_forms_too_large_together_are_compiled_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills _batches' split mutants: ``len(forms) >= 1`` (an empty batch that matches everywhere), ``> 2``
    (two forms dropped instead of split), ``half = None`` / ``/ 2`` / ``// 3``, ``-`` between the halves and
    ``_batches(None)`` for either half. RE2 is made to refuse any pattern over 300 characters."""
    compile_re2 = logs._re2

    def small_re2(pattern: str, *, longest: bool = False) -> logs._Regex:
        if len(pattern) > 300 and not pattern.endswith("\\z"):
            raise re2.error("pattern too large")
        return compile_re2(pattern, longest=longest)

    monkeypatch.setattr(logs, "_re2", small_re2)
    forms = [logs._Form(logs._literal(word)) for word in ("alpha-secret-" + "a" * 200, "beta-secret-" + "b" * 200)]
    batches = logs._batches(forms)
    assert len(batches) == 2
    text = f"x {'alpha-secret-' + 'a' * 200} y {'beta-secret-' + 'b' * 200} z"
    for batch in batches:
        text = batch.forms.sub(REDACTED, text)
    assert text == f"x {REDACTED} y {REDACTED} z"
    assert logs._batches([logs._Form(logs._literal("c" * 400))]) == []  # alone and too large: left out


def test_a_secret_that_extends_another_is_redacted_whole() -> None:
    """Kills _batches' ``longest=True`` -> ``None`` / ``False`` / left out (the shorter secret's form would win
    the alternation and leave the rest of the longer one in the text) and _re2's ``longest_match = None``."""
    short, long = "abcdefgh", "abcdefgh-and-the-rest"
    redact = Redactor([short, long])
    assert redact(f"token {long} end") == f"token {REDACTED} end"


def test_a_long_secrets_start_is_held_back_from_an_unfinished_text() -> None:
    """Kills _Form.start_pattern's mutants (the last atom, the ``(?s:.*)`` for a form longer than
    ``_UNFINISHED_ATOMS``, the loop over the earlier atoms) and _batches' ``"XX(?:{})\\zXX"`` / ``format(None)``
    / ``"XX|XX"``: a streamed answer ending with the first 70 characters of a 100-character secret."""
    secret = "".join(chr(ord("a") + (i * 7) % 26) for i in range(100))
    redact = Redactor([secret])
    assert redact.redact_unfinished(f"the key is\n{secret[:70]}") == "the key is\n"
    assert redact.redact_unfinished(f"the key is\n{secret[:3]}") == "the key is\n"
    assert redact.redact_unfinished("the key is\nnothing") == "the key is\n"  # the last word, always
    assert redact.redact_unfinished("the key is nothing\n") == "the key is nothing\n"


def test_an_unfinished_text_without_a_held_back_tail_is_shown_whole() -> None:
    """Kills redact_unfinished's ``default=None`` (with no tail to hold back, the whole text is shown)."""
    assert Redactor().redact_unfinished("") == ""
    assert Redactor(["configured-secret"]).redact_unfinished("done.\n") == "done.\n"


def test_text_with_lone_surrogates_keeps_them_through_redaction() -> None:
    """Kills ``surrogatepass`` dropped or misspelt in __call__ and redact_unfinished (a file name decoded with
    surrogateescape would raise instead of being redacted)."""
    redact = Redactor(["configured-secret"])
    text = "file \udcff name configured-secret\n"
    assert redact(text) == f"file \udcff name {REDACTED}\n"
    assert redact.redact_unfinished(text) == f"file \udcff name {REDACTED}\n"


def test_a_secret_with_a_lone_surrogate_is_redacted_in_its_encodings() -> None:
    """Kills _forms' ``surrogatepass`` mutants (``errors`` dropped or misspelt for the bytes and the percent
    forms) and _is_unicode's ``return True`` (RE2 asked to spell a lone surrogate)."""
    secret = "pass\udcffword-123"
    redact = Redactor([secret])
    data = secret.encode("utf-8", "surrogatepass")
    assert REDACTED in redact(f"hex {data.hex()} end")
    assert REDACTED in redact(f"url {logs.quote(secret, safe='', errors='surrogatepass')} end")


def test_a_non_ascii_secret_is_redacted_json_escaped_and_as_is() -> None:
    """Kills _forms' ``json.dumps(None, ...)`` and ``ensure_ascii=True`` / left out for the unescaped JSON form."""
    secret = "mot-de-passe-été"
    redact = Redactor([secret])
    assert redact(json.dumps({"k": secret}, ensure_ascii=False)) == json.dumps({"k": REDACTED})
    assert redact(json.dumps({"k": secret})) == json.dumps({"k": REDACTED})


def test_json_log_lines_carry_their_fields_redacted() -> None:
    """Kills _JsonFormatter.format's key and value mutants (``ts``, ``logger``, ``msg``, ``exc``, the time zone,
    the traceback) and ``ensure_ascii=True`` / left out."""
    logs.redactor.add(["json-log-secret"])
    record = logging.LogRecord("gateway.test", logging.ERROR, __file__, 1, "café json-log-secret", (), None)
    try:
        raise ValueError("boom json-log-secret")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = logs._JsonFormatter().format(record)
    entry = json.loads(line)
    assert set(entry) == {"ts", "level", "logger", "msg", "exc"}
    assert entry["ts"].endswith("+00:00") and entry["level"] == "ERROR" and entry["logger"] == "gateway.test"
    assert entry["msg"] == f"café {REDACTED}"
    assert "ValueError: boom" in entry["exc"] and "json-log-secret" not in entry["exc"]
    assert "café" in line


def test_the_start_of_a_wrapped_encoded_secret_is_held_back_across_lines() -> None:
    """Kills _batches' ``"(?:{})\\\\z".format(None)`` and ``"XX|XX".join`` (only the last word of an unfinished
    text would be held back, not the start of a base64 form wrapped over lines before it)."""
    import base64

    secret = "".join(chr(ord("a") + (i * 11) % 26) for i in range(60))
    encoded = base64.b64encode(secret.encode()).decode()
    redact = Redactor([secret])
    shown = redact.redact_unfinished(f"here it is:\n{encoded[:40]}\n{encoded[40:56]}")
    assert shown == "here it is:\n"


# -- found by the run of 2026-12-04 ----------------------------------------------------------------------------

def test_a_secret_in_json_that_keeps_its_non_ascii_characters_is_redacted() -> None:
    """JSON written with ``ensure_ascii=False`` escapes the quote but keeps "ä": its own form of the secret.

    Kills _forms' ``json.dumps(None, ensure_ascii=False)``, ``ensure_ascii=True`` / left out (only the
    ASCII-escaped form) and the ``[2:-1]`` / ``[1:-2]`` slices (the form's first or last character left out:
    "p" or "2" left in the text)."""
    secret = 'pässwört"2024'
    text = json.dumps({"password": secret}, ensure_ascii=False)
    assert Redactor([secret])(text) == json.dumps({"password": REDACTED})


def test_an_unfinished_long_form_that_wraps_is_held_back_from_its_start() -> None:
    """A streamed text that ends in the first 69 bytes of a 70-character secret's hex dump (bytes apart, as
    ``xxd`` prints them) is held back from the dump's start: past the first ``_UNFINISHED_ATOMS`` bytes the rest
    may be anything.

    Kills _Form.start_pattern's ``pattern = None``, ``atoms[+1]`` / ``atoms[-2]`` (the wrong byte where the
    followed start ends), ``(?s:.*)`` dropped (``and False``) or misspelt, and ``reversed(atoms[:-2])`` (a byte
    of the start skipped): each lets the start of the dump out."""
    secret = "".join(chr(ord("a") + i % 26) for i in range(70))
    dump = " ".join(f"{byte:02x}" for byte in secret.encode()[:69])
    assert len(dump.split()) > logs._UNFINISHED_ATOMS
    assert Redactor([secret]).redact_unfinished(f"the dump: {dump}") == "the dump: "


# -- the gaps of the run of 2026-12-04 ---------------------------------------------------------------------------

def test_a_base64_form_with_fewer_than_eight_whole_characters_is_not_redacted() -> None:
    """A 6-byte secret (48 bits) is 8 characters of its own in base64 when it starts a 3-byte group, but only 7
    when it starts 1 byte into one: that form would also match ordinary base64 by chance, so it is not
    redacted (``_MIN_ENCODED_CHARS``); the aligned one is.

    Kills _base64_forms' ``atoms, whole = [], 1`` (every form counted one character longer: the 7-character
    form redacted)."""
    import base64

    secret = "k3y!$9"
    redact = Redactor([secret])
    aligned = base64.b64encode(secret.encode() + b"tail").decode()
    shifted = base64.b64encode(b"<" + secret.encode() + b"tail").decode()
    assert redact(f"blob {aligned} end").startswith(f"blob {REDACTED}")
    assert redact(f"blob {shifted} end") == f"blob {shifted} end"


def test_a_partial_base64_character_matches_only_the_values_the_secret_allows() -> None:
    """The last character of a 7-byte secret's base64 holds 2 of its bits ("c" ends in 11: one of
    ``w``..``/``); a stream with another character there is not the secret and is left as it is.

    Kills _base64_forms' ``"XXXX".join`` for a partial character's class (the class would also accept "X"),
    and the padding's ``"={0,2}"`` left out, ``(end_bit % 6) and False`` and ``end_bit % 7`` (the stream's "=="
    left after the redaction)."""
    import base64

    secret = "passabc"
    encoded = base64.b64encode(secret.encode()).decode()
    assert encoded[9] == "w" and encoded.endswith("w==")
    redact = Redactor([secret])
    assert redact(f"blob {encoded} end") == f"blob {REDACTED} end"
    other = encoded[:9] + "X=="
    assert redact(f"blob {other} end") == f"blob {other} end"


def test_a_secret_of_ten_thousand_characters_is_redacted_in_every_form(caplog: pytest.LogCaptureFixture) -> None:
    """A very long configured value (a key file, say) still fits RE2's memory budget: its plain, hex and base64
    forms (at each offset into a 3-byte group) are all redacted, none is left out with a warning.

    Kills _re2's ``max_mem = 64 >> 20`` (a budget of 0: RE2's own minimum, in which the 13,334-character base64
    forms and the hex form do not compile and are left out)."""
    import base64

    secret = "".join("abcdefghijklmnopqrstuvwxyz0123456789"[(i * 7 + i // 36) % 36] for i in range(10_000))
    data = secret.encode()
    with caplog.at_level(logging.WARNING, logger="gateway.logs"):
        redact = Redactor([secret])
    assert not [r for r in caplog.records if "too large to redact" in r.getMessage()]
    for shown in (secret, data.hex(), *(base64.b64encode(lead + data).decode() for lead in (b"", b"a", b"ab"))):
        text = redact(f"value: {shown} end")
        assert REDACTED in text and shown[20:-20] not in text
