"""Logging setup: text or JSON lines, with secrets redacted from every record (tracebacks included)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, quote_plus

import re2

REDACTED = "[REDACTED]"
_REDACTED_BYTES = REDACTED.encode()

logger = logging.getLogger(__name__)

_Regex = re2._Regexp  # google-re2 has no public name for a compiled pattern


def _re2(pattern: str, *, longest: bool = False) -> _Regex:
    options = re2.Options()
    options.max_mem = 64 << 20  # room for a batch of secrets' forms, and for its DFA
    options.log_errors = False
    options.longest_match = longest
    return re2.compile(pattern, options)


# Token shapes redacted even when they are not in the configuration: (pattern, replacement). RE2 runs them in
# time linear in the text; it has no lookbehind, so a character that must precede a token is captured and kept.
_KEEP_1 = rb"\1" + _REDACTED_BYTES
_TOKEN_PATTERNS: list[tuple[_Regex, bytes]] = [
    (_re2(r"(^|[^0-9])\d{6,12}:[A-Za-z0-9_-]{30,}"), _KEEP_1),              # Telegram bot token
    (_re2(r"xox[abprs]-[A-Za-z0-9-]{8,}"), _REDACTED_BYTES),               # Slack bot/user tokens
    (_re2(r"xapp-[A-Za-z0-9-]{8,}"), _REDACTED_BYTES),                     # Slack app-level token
    (_re2(r"\bsk-[A-Za-z0-9_-]{16,}"), _REDACTED_BYTES),                   # OpenAI-style API keys
    (_re2(r"whsec_[A-Za-z0-9+/=]{8,}"), _REDACTED_BYTES),                  # Standard Webhooks secrets
    (_re2(r"(/bot)[A-Za-z0-9:_-]{20,}"), _KEEP_1),                         # token in a Bot API URL path
    (_re2(r"(?i)(bearer\s+|\bbot\s+)[A-Za-z0-9._~+/=-]{12,}"), _KEEP_1),  # auth headers
    (_re2(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"), _REDACTED_BYTES),  # JWTs
    (_re2(r"""(?i)([?&](?:token|access_token|api_key|key|secret|signature)=)[^&\s#"']+"""), _KEEP_1),
]
# Any of them: one pass finds that most texts hold none, so the patterns above only run on the rest.
_ANY_TOKEN = _re2("|".join(f"(?:{pattern.pattern})" for pattern, _ in _TOKEN_PATTERNS))
# An unfinished text's last word may be the start of a token or secret.
_LAST_WORD = _re2(r"\S+\z")

_MIN_SECRET_CHARS = 6  # shorter configured values are ignored: they would mangle ordinary text
_MIN_ENCODED_CHARS = 8  # encoded forms with fewer fully determined characters than this occur by chance
_BATCH_ATOMS = 4000  # per RE2 pattern: a much larger one outgrows RE2's DFA memory and runs 100x slower
_UNFINISHED_ATOMS = 64  # how much of a form's start ``redact_unfinished`` follows before holding back the rest
# Allowed between the characters of an encoded form: line wraps (base64 wraps at 76 columns, xxd -p at 60) and
# other whitespace, also as the \n and \r escapes of a JSON string.
_WRAP = r"(?:\s|\\[nr])*"
_BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_URLSAFE = {"+": "-", "/": "_"}


@dataclass(frozen=True, slots=True)
class _Form:
    """One way a secret can appear in text, as a regex per character (or per byte, for hex)."""

    atoms: tuple[str, ...]
    sep: str = ""
    """Allowed between two atoms."""
    tail: str = ""
    """Appended to the whole form (base64 padding)."""

    def pattern(self) -> str:
        """The whole form."""
        return self.sep.join(self.atoms) + self.tail

    def start_pattern(self) -> str:
        """Any non-empty start of the form; once its first ``_UNFINISHED_ATOMS`` atoms are there, anything after."""
        atoms = self.atoms[:_UNFINISHED_ATOMS]
        pattern = atoms[-1] + ("(?s:.*)" if len(self.atoms) > len(atoms) else "")
        for atom in reversed(atoms[:-1]):
            pattern = f"{atom}(?:{self.sep}(?:{pattern})?)?"
        return pattern


def _literal(text: str) -> tuple[str, ...]:
    return tuple(re2.escape(char) for char in text)


def _any_case(char: str) -> str:
    return f"[{char.lower()}{char.upper()}]" if char.isalpha() else char


def _url_atoms(text: str) -> tuple[str, ...]:
    """Atoms of a percent-encoded text, its hex digits in either case (encoders differ)."""
    atoms: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "%":
            atoms.append("%" + "".join(_any_case(c) for c in text[i + 1:i + 3]))
            i += 3
        else:
            atoms.append(re2.escape(text[i]))
            i += 1
    return tuple(atoms)


def _base64_forms(data: bytes) -> list[_Form]:
    """``data`` inside a longer base64 stream (either alphabet, padded or not, wrapped or not), starting 0, 1 or
    2 bytes into a 3-byte group. Characters that also carry bits of the neighbouring bytes become the class of
    every value they can take; only the characters made of the secret's bits alone must be long enough."""
    bits = "".join(f"{byte:08b}" for byte in data)
    forms = []
    for offset in range(3):
        first_bit, end_bit = offset * 8, offset * 8 + len(bits)
        atoms, whole = [], 0
        for index in range(first_bit // 6, (end_bit - 1) // 6 + 1):
            mask = value = 0
            for bit in range(6):
                position = index * 6 + bit
                if first_bit <= position < end_bit:
                    mask |= 32 >> bit
                    value |= int(bits[position - first_bit]) * (32 >> bit)
            whole += mask == 63
            chars = {_BASE64[v] for v in range(64) if v & mask == value}
            chars |= {_URLSAFE[c] for c in chars if c in _URLSAFE}
            atoms.append(re2.escape(next(iter(chars))) if len(chars) == 1
                         else "[" + "".join(re2.escape(c) for c in sorted(chars)) + "]")
        if whole >= _MIN_ENCODED_CHARS:
            # When the stream ends with the secret, its last character is partial and padding may follow.
            forms.append(_Form(tuple(atoms), _WRAP, "={0,2}" if end_bit % 6 else ""))
    return forms


def _forms(secret: str) -> list[_Form]:
    """The plain, base64, hex, percent-encoded and JSON-escaped forms of ``secret``."""
    data = secret.encode("utf-8", errors="surrogatepass")
    forms = _base64_forms(data)
    forms.append(_Form(tuple("".join(_any_case(c) for c in f"{byte:02x}") for byte in data), _WRAP))
    for encoded in dict.fromkeys([quote(secret, safe="", errors="surrogatepass"),
                                  quote(secret, errors="surrogatepass"), quote_plus(secret, errors="surrogatepass")]):
        if encoded != secret:
            forms.append(_Form(_url_atoms(encoded)))
    for literal in dict.fromkeys([secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]]):
        if _is_unicode(literal):  # RE2 cannot spell a lone surrogate; its other forms still apply
            forms.append(_Form(_literal(literal)))
    return forms


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class _Batch:
    """Some secrets' forms as two RE2 patterns (batches keep each small enough for RE2's fast DFA)."""

    forms: _Regex
    """Any form of these secrets."""
    unfinished: _Regex
    """A tail of a text that may be the start of one of these forms."""


@dataclass(frozen=True, slots=True)
class _SecretPatterns:
    secrets: frozenset[str]
    batches: tuple[_Batch, ...]


def _compile(secrets: frozenset[str]) -> _SecretPatterns:
    """One alternation per batch of secrets (a form RE2 cannot compile even alone is left out, and logged)."""
    batches: list[_Batch] = []
    pending: dict[_Form, None] = {}  # ordered, without duplicates
    for secret in sorted(secrets):
        forms = _forms(secret)
        if pending and sum(len(f.atoms) for f in [*pending, *forms]) > _BATCH_ATOMS:
            batches += _batches(list(pending))
            pending = {}
        pending.update(dict.fromkeys(forms))
    if pending:
        batches += _batches(list(pending))
    return _SecretPatterns(secrets, tuple(batches))


def _batches(forms: list[_Form]) -> list[_Batch]:
    """The forms as one batch, or as several when RE2 finds them too large (a very long secret)."""
    try:
        whole = _re2("|".join(form.pattern() for form in forms), longest=True)
        starts = _re2("(?:{})\\z".format("|".join(form.start_pattern() for form in forms)))
    except re2.error:
        if len(forms) > 1:
            half = len(forms) // 2
            return _batches(forms[:half]) + _batches(forms[half:])
        logger.warning("a secret's %d-character form is too large to redact; it is left out", len(forms[0].atoms))
        return []
    return [_Batch(whole, starts)]


class Redactor:
    """Replaces configured secrets (plain and encoded) and known token shapes with a marker, in linear time."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._patterns = _compile(frozenset())
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Also redact these values and their encodings (short ones are ignored to avoid mangling text)."""
        with self._lock:
            current = self._patterns.secrets
            merged = current | {s for s in secrets if s and len(s) >= _MIN_SECRET_CHARS}
            if merged != current:
                self._patterns = _compile(merged)  # swapped whole: readers never see half of it

    def __call__(self, text: str) -> str:
        return self._redact(text.encode("utf-8", errors="surrogatepass")).decode("utf-8", errors="surrogatepass")

    def redact_unfinished(self, text: str) -> str:
        """Redact a text that is still being written (a streamed answer), holding back its tail when that may
        be the start of a secret: the last word, or the first characters of a form that wraps over lines."""
        data = self._redact(text.encode("utf-8", errors="surrogatepass"))
        tails = [_LAST_WORD, *(batch.unfinished for batch in self._patterns.batches)]
        cut = min((m.start() for tail in tails if (m := tail.search(data))), default=len(data))
        return data[:cut].decode("utf-8", errors="surrogatepass")

    def _redact(self, data: bytes) -> bytes:
        # Matching UTF-8 bytes rather than str: no offset conversions, and lone surrogates (from file names
        # decoded with surrogateescape) pass through instead of failing to encode.
        for batch in self._patterns.batches:
            # The wrapper's sub() walks matches in Python; one search in C first skips that for the usual text
            # with no secret in it (half the cost of a run's redaction).
            if batch.forms.search(data) is not None:
                data = batch.forms.sub(_REDACTED_BYTES, data)
        if _ANY_TOKEN.search(data) is not None:
            for pattern, replacement in _TOKEN_PATTERNS:
                data = pattern.sub(replacement, data)
        return data


redactor = Redactor()


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redactor(super().format(record))


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(), "level": record.levelname,
                 "logger": record.name, "msg": redactor(record.getMessage())}
        if record.exc_info:
            entry["exc"] = redactor(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


# Warnings of libraries about features the gateway does not use, by logger and message start: demoted to DEBUG.
_IRRELEVANT: dict[str, tuple[str, ...]] = {
    # voice: the gateway sends and receives text only
    "discord.client": ("PyNaCl is not installed", "davey is not installed"),
    # from the REST-only client that sends (it opens no gateway connection, so it asks for no intents); the
    # client that receives asks for the guilds intent
    "discord.state": ("Guilds intent seems to be disabled",),
}


class _DemoteIrrelevant(logging.Filter):
    """Turns the ``_IRRELEVANT`` warnings into DEBUG records, shown only when the handler's level is DEBUG."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        starts = _IRRELEVANT.get(record.name)
        if starts and record.levelno > logging.DEBUG and str(record.msg).startswith(starts):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return record.levelno >= self.level


def setup_logging(level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Install one stderr handler on the root logger (replacing earlier ones)."""
    redactor.add(secrets)
    # discord.py imports audioop (deprecated since Python 3.11) for voice, which the gateway does not use.
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else
                         _RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    handler.addFilter(_DemoteIrrelevant(root.level))
    # Request logs of the HTTP clients would print URLs that embed bot tokens.
    for noisy in ("httpx", "httpx2", "httpcore", "aiohttp.access", "telegram.ext.Updater"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
