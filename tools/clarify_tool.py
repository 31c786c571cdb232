"""The ``clarify`` tool: ask the user a question and end the agent's turn.

The result carries ``"ends_turn": true``; the gateway's agent loop then sends the question
(rendered by ``format_clarify_question``) to the chat and ends the run. The user's answer
arrives as the next chat message.
"""

from __future__ import annotations

import json
from typing import Any

from tools.registry import ISOLATION_PROCESS, registry, tool_error, tool_result

MAX_CHOICES = 6
MAX_CHOICE_CHARS = 100


def _clarify(args: dict[str, Any], **ctx: Any) -> str:
    """Handler of the ``clarify`` tool."""
    question = args.get("question")
    if not isinstance(question, str) or not question.strip():
        return tool_error("clarify needs a non-empty 'question'.")
    choices = args.get("choices") or []
    if not isinstance(choices, list):
        return tool_error("'choices' must be a list of short strings.")
    if len(choices) > MAX_CHOICES:
        return tool_error(f"{len(choices)} choices given; offer at most {MAX_CHOICES}.")
    if not all(isinstance(c, str) and c.strip() and len(c.strip()) <= MAX_CHOICE_CHARS for c in choices):
        return tool_error(f"Each choice must be a non-empty string of at most {MAX_CHOICE_CHARS} characters.")
    return tool_result(question=question.strip(), choices=[c.strip() for c in choices], ends_turn=True)


def parse_clarify(result_json: str) -> tuple[str, list[str]] | None:
    """The chat message for a clarify result (question, then numbered choices) and its choices (the gateway shows
    them as buttons too, where the platform has them); None for other results."""
    try:
        payload = json.loads(result_json)
    except (TypeError, ValueError):
        return None
    if not isinstance(payload, dict) or payload.get("ends_turn") is not True:
        return None
    question, choices = payload.get("question"), payload.get("choices", [])
    if not isinstance(question, str) or not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        return None
    if not choices:
        return question, []
    return question + "\n\n" + "\n".join(f"{n}. {choice}" for n, choice in enumerate(choices, 1)), choices


def format_clarify_question(result_json: str) -> str | None:
    """The chat message for a clarify result (see ``parse_clarify``); None for other results."""
    parsed = parse_clarify(result_json)
    return parsed[0] if parsed is not None else None


registry.register(
    name="clarify",
    toolset="clarify",
    schema={
        "name": "clarify",
        "description": (
            "Ask the user a question when you cannot continue well without their answer (an ambiguous "
            "request, a choice only they can make). Your turn ends; their reply arrives as the next "
            f"message. Optionally offer up to {MAX_CHOICES} short choices; the user may also answer freely."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The question, as the user should read it."},
                "choices": {
                    "type": "array",
                    "items": {"type": "string"},
                    "maxItems": MAX_CHOICES,
                    "description": "Optional short answers to pick from; shown numbered.",
                },
            },
            "required": ["question"],
        },
    },
    handler=_clarify,
    isolation=ISOLATION_PROCESS,  # only formats a question for the user
    emoji="❓",
)
