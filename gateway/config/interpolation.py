"""``${VAR}`` and ``${VAR:-default}`` in string values (never keys); ``$$`` is a literal ``$``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.config.errors import _SECRET_FIELDS, ConfigError, _format_path, _Loc

_TOKEN = re.compile(r"\$\$|\$\{([^}]*)\}|\$\{")
# The default is literal text; "{" in it would be an (unsupported) nested reference.
_REFERENCE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^{]*))?")
_INTERPOLATION_HINT = "write ${VAR} or ${VAR:-default}; write $$ for a literal $"



def _interpolate_str(text: str, env: Mapping[str, str], loc: _Loc) -> str:
    out: list[str] = []
    pos = 0
    for match in _TOKEN.finditer(text):
        out.append(text[pos:match.start()])
        pos = match.end()
        if match.group(0) == "$$":
            out.append("$")
            continue
        inner = match.group(1)
        ref = None if inner is None else _REFERENCE.fullmatch(inner)
        if ref is None:
            shown = "" if _SECRET_FIELDS.intersection(map(str, loc)) else f" {match.group(0)[:40]!r}"
            raise ConfigError(_format_path(loc), f"malformed ${{...}} reference{shown}", _INTERPOLATION_HINT)
        name, default, value = ref["name"], ref["default"], env.get(ref["name"])
        if default is not None:
            out.append(value or default)
        elif value is None:
            raise ConfigError(_format_path(loc), f"environment variable {name} is not set",
                              f"export it, or write ${{{name}:-default}}")
        else:
            out.append(value)
    out.append(text[pos:])
    return "".join(out)


def interpolate(value: Any, env: Mapping[str, str], loc: _Loc, errors: list[ConfigError]) -> Any:
    """Interpolate every string value (never keys) of parsed YAML, collecting errors."""
    if isinstance(value, str):
        try:
            return _interpolate_str(value, env, loc)
        except ConfigError as exc:
            errors.append(exc)
            return value
    if isinstance(value, Mapping):
        return {k: interpolate(v, env, (*loc, k), errors) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, (*loc, i), errors) for i, v in enumerate(value)]
    return value

