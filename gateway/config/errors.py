"""ConfigError, and how validation problems become one: dotted key path, message, hint."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

# Field names whose values must never be echoed in an error message.
_SECRET_FIELDS = frozenset({"api_key", "api_token", "secret", "token", "webhook_secret", "bot_token", "app_token",
                            "signing_secret"})


class ConfigError(Exception):
    """A configuration problem: dotted key ``path`` ("" for the file itself), ``message`` and ``hint``.

    When several problems are found at once, ``errors`` lists each and ``str()`` puts one per line;
    for a single problem ``errors == [self]``.
    """

    def __init__(self, path: str = "", message: str = "", hint: str = "",
                 errors: Sequence[ConfigError] = ()) -> None:
        self.path = path
        self.message = message
        self.hint = hint
        self.errors: list[ConfigError] = list(errors) or [self]
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.errors[0] is not self:
            return "\n".join(str(e) for e in self.errors)
        head = ": ".join(part for part in (self.path, self.message) if part)
        return f"{head} ({self.hint})" if self.hint else head

    @classmethod
    def combine(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error as itself; several as one error listing them all."""
        if len(errors) == 1:
            return errors[0]
        return cls(message=f"{len(errors)} configuration errors", errors=errors)


_Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class _Problem:
    loc: _Loc  # relative to the value being validated
    message: str
    hint: str = ""


class _Invalid(ValueError):
    """Raised by validators; pydantic keeps it in the error's ctx, so our path, message and hint survive."""

    def __init__(self, *problems: _Problem) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


def _invalid(message: str, hint: str = "", loc: _Loc = ()) -> _Invalid:
    return _Invalid(_Problem(loc, message, hint))


def _suggest(word: str, choices: Sequence[str], *, allowed: bool = True) -> str:
    """A hint of the form ``did you mean 'x'? allowed: a, b``."""
    close = difflib.get_close_matches(word, choices, n=1)
    parts = [f"did you mean {close[0]!r}?"] if close else []
    if allowed:
        parts.append(f"allowed: {', '.join(sorted(choices))}")
    return " ".join(parts)


def _raise_if(problems: list[_Problem]) -> None:
    if problems:
        raise _Invalid(*problems)


def _format_path(loc: _Loc) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _model_at(root: type[BaseModel], loc: _Loc) -> type[BaseModel]:
    """The model class validated at ``loc`` under ``root`` (a path that pydantic already walked)."""
    tp: Any = root
    for part in loc:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            tp = tp.model_fields[str(part)].annotation
        else:  # a dict value or a list item
            tp = get_args(tp)[-1]
    return tp


def _describe(value: Any) -> str:
    if value is None:
        return "got an empty value"
    if isinstance(value, Mapping):
        return "got a mapping"
    if isinstance(value, list):
        return "got a list"
    shown = repr(value)
    return f"got {shown if len(shown) <= 60 else shown[:57] + '...'}"


def from_validation_error(exc: ValidationError, root: type[BaseModel]) -> ConfigError:
    """Every problem pydantic found validating ``root``, as one ConfigError."""
    errors: list[ConfigError] = []
    for err in exc.errors():
        loc: _Loc = tuple(part for part in err["loc"] if part != "[key]")
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, _Invalid):
            errors.extend(ConfigError(_format_path((*loc, *p.loc)), p.message, p.hint) for p in cause.problems)
        elif err["type"] == "extra_forbidden":
            allowed = list(_model_at(root, loc[:-1]).model_fields)
            errors.append(ConfigError(_format_path(loc), "unknown key", _suggest(str(loc[-1]), allowed)))
        elif err["type"] == "missing":
            errors.append(ConfigError(_format_path(loc), "required"))
        elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
            hint = "it is empty: add its keys, or remove it" if err["input"] is None else _describe(err["input"])
            errors.append(ConfigError(_format_path(loc), "must be a mapping", hint))
        else:
            secret = _SECRET_FIELDS.intersection(map(str, loc))
            errors.append(ConfigError(_format_path(loc), err["msg"], "" if secret else _describe(err["input"])))
    return ConfigError.combine(errors)

