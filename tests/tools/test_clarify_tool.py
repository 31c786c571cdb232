import json
from typing import Any

import pytest

from tools.clarify_tool import MAX_CHOICE_CHARS, MAX_CHOICES, format_clarify_question
from tools.registry import registry, tool_error, tool_result


def call(**args: Any) -> str:
    return registry.dispatch("clarify", args, session_key="telegram:dm:42", unknown_ctx=object())


def test_registered_in_clarify_toolset_without_effects() -> None:
    entry = registry.get("clarify")
    assert entry is not None
    assert entry.toolset == "clarify"
    assert entry.effects == frozenset()
    assert entry.schema["parameters"]["required"] == ["question"]


def test_result_carries_question_choices_and_ends_turn() -> None:
    result = json.loads(call(question="  Which environment? ", choices=[" staging", "production "]))
    assert result == {
        "question": "Which environment?",
        "choices": ["staging", "production"],
        "ends_turn": True,
    }


@pytest.mark.parametrize("choices", [None, []])
def test_choices_are_optional(choices: list[str] | None) -> None:
    args: dict[str, Any] = {"question": "What should I call the project?"}
    if choices is not None:
        args["choices"] = choices
    result = json.loads(call(**args))
    assert result == {"question": "What should I call the project?", "choices": [], "ends_turn": True}


def test_up_to_the_choice_limit_is_accepted() -> None:
    choices = [f"option {n}" for n in range(MAX_CHOICES)]
    assert json.loads(call(question="Pick one", choices=choices))["choices"] == choices


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({}, "non-empty 'question'"),
        ({"question": "   "}, "non-empty 'question'"),
        ({"question": 7}, "non-empty 'question'"),
        ({"question": "Q?", "choices": "yes or no"}, "must be a list"),
        ({"question": "Q?", "choices": [str(n) for n in range(MAX_CHOICES + 1)]}, f"at most {MAX_CHOICES}"),
        ({"question": "Q?", "choices": ["yes", ""]}, "non-empty string"),
        ({"question": "Q?", "choices": ["yes", 2]}, "non-empty string"),
        ({"question": "Q?", "choices": ["x" * (MAX_CHOICE_CHARS + 1)]}, str(MAX_CHOICE_CHARS)),
    ],
)
def test_invalid_arguments_are_errors(args: dict[str, Any], fragment: str) -> None:
    result = json.loads(call(**args))
    assert fragment in result["error"]
    assert "ends_turn" not in result


def test_format_numbers_the_choices() -> None:
    message = format_clarify_question(call(question="Which environment?", choices=["staging", "production"]))
    assert message == "Which environment?\n\n1. staging\n2. production"


def test_format_without_choices_is_just_the_question() -> None:
    assert format_clarify_question(call(question="What should I call it?")) == "What should I call it?"


@pytest.mark.parametrize(
    "result",
    [
        tool_error("clarify needs a non-empty 'question'."),
        tool_result(count=0, notes=[]),
        tool_result(question="Q?", choices=[], ends_turn=False),
        tool_result(question="Q?", choices=[], ends_turn="true"),
        tool_result(question=None, ends_turn=True),
        tool_result(question="Q?", choices="a", ends_turn=True),
        json.dumps(["Q?"]),
        "not json",
        "",
    ],
)
def test_format_returns_none_for_other_results(result: str) -> None:
    assert format_clarify_question(result) is None
