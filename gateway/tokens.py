"""Token counts as OpenAI's ``o200k_base`` tokenizer makes them: the size of a request before a model server
reports its usage (other models' tokenizers differ a little; the reported usage corrects for that)."""

from __future__ import annotations

import functools

import bpe_openai

ENCODING = "o200k_base"


@functools.cache
def _encoding() -> bpe_openai.Encoding:
    return bpe_openai.get_encoding(ENCODING)


def warm() -> None:
    """Load the vocabulary now (about a quarter of a second), so no count pays for it on the event loop."""
    _encoding()


@functools.lru_cache(maxsize=16384)
def count(text: str) -> int:
    """Tokens in ``text``. Cached: a session's history is counted again on each run, each message once."""
    return len(_encoding().encode_ordinary(text)) if text else 0
