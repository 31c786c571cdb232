"""Tool schemas for strict OpenAI-compatible servers: a copy of each parameters schema in the JSON Schema subset
that servers compiling schemas into grammars accept.

llama.cpp (``json_schema_to_grammar``, documented in its ``grammars/README.md``) is the model: it fails on type
names it does not know, remote or nested ``$ref``s, regex syntax its translator lacks (``(?...)`` groups, class
escapes such as ``\\d``) and bounds that are not integers; it ignores ``properties`` beside ``anyOf``/``oneOf``,
bounds on numbers and ``format``s other than dates, times and UUIDs; it has no ``not``, conditionals,
``patternProperties``, ``uniqueItems`` or ``contains``. Other strict servers refuse ``$schema``, ``default`` or
``required`` names that no property declares. So the sanitizer keeps only the keywords those grammars read, with
valid values: local ``$ref``s inlined, ``allOf`` merged, ``oneOf`` read as ``anyOf``, ``nullable`` as a ``null``
type, a ``default`` moved into the description, ``required`` cut to declared names without duplicates. Stdlib only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

TYPES = ("string", "number", "integer", "boolean", "null", "array", "object")
FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
_INTEGER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_MAX_DEPTH = 32  # deeper nodes become "any value": a grammar that deep is not worth its size
_MAX_DEFAULT_CHARS = 80
# A grammar translator takes literals, classes, groups and quantifiers; lookarounds, named or non-capturing
# groups, back-references and class escapes (\d, \w, \s, \b ...) are beyond it.
_UNSUPPORTED_PATTERN = re.compile(r"\(\?|\\[A-Za-z0-9]")


def sanitize_definition(definition: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAI tool definition (``{"type": "function", "function": {...}}``), parameters sanitized."""
    function = dict(definition.get("function") or {})
    function["parameters"] = sanitize_parameters(function.get("parameters"))
    if not isinstance(function.get("description", ""), str):
        del function["description"]
    return {**definition, "function": function}


def sanitize_parameters(parameters: Any) -> dict[str, Any]:
    """A tool's parameters schema in the strict subset: always ``type: object`` with ``properties``."""
    root = parameters if isinstance(parameters, Mapping) else {}
    clean = _Sanitizer(root).schema(root, 0)
    alternatives = clean.pop("anyOf", [])
    if "properties" not in clean:  # one of several argument shapes: offer every property, require none
        clean["properties"] = {name: sub for alt in alternatives for name, sub in alt.get("properties", {}).items()}
    clean["type"] = "object"
    return clean


class _Sanitizer:
    """One schema's walk: its ``$defs`` for inlining references, and the references being inlined."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.inlining: list[str] = []

    def schema(self, node: Any, depth: int) -> dict[str, Any]:
        """The sanitized copy of one schema node (``True``, a non-mapping or one too deep: any value)."""
        if not isinstance(node, Mapping) or depth > _MAX_DEPTH:
            return {}
        ref = node.get("$ref")
        if isinstance(ref, str):
            return self._inline(ref, node, depth)
        node = self._merge_all_of(node)
        out: dict[str, Any] = {}
        types = _types(node)
        if types:
            out["type"] = types[0] if len(types) == 1 else types
        for key in ("title", "description"):
            if isinstance(node.get(key), str):
                out[key] = node[key]
        _describe_default(node, out)
        if "const" in node:
            out["const"] = node["const"]
        if isinstance(node.get("enum"), list) and (values := _unique(node["enum"])):
            out["enum"] = values
        self._object(node, out, depth)
        self._array(node, out, depth)
        _string(node, out, types)
        _integer(node, out, types)
        alternatives = node.get("anyOf", node.get("oneOf"))
        if isinstance(alternatives, list) and "properties" not in out:
            kept = [self.schema(alt, depth + 1) for alt in alternatives if alt is not False]
            if kept:
                out["anyOf"] = kept
        return out

    def _object(self, node: Mapping[str, Any], out: dict[str, Any], depth: int) -> None:
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            out["properties"] = {name: self.schema(sub, depth + 1) for name, sub in properties.items()
                                 if isinstance(name, str) and sub is not False}
            required = node.get("required") if isinstance(node.get("required"), list) else []
            names = [n for n in _unique(required) if isinstance(n, str) and n in out["properties"]]
            if names:
                out["required"] = names
            out.setdefault("type", "object")
        extra = node.get("additionalProperties")
        if isinstance(extra, bool):
            out["additionalProperties"] = extra
        elif isinstance(extra, Mapping):
            out["additionalProperties"] = self.schema(extra, depth + 1)

    def _array(self, node: Mapping[str, Any], out: dict[str, Any], depth: int) -> None:
        items = node.get("items")
        if isinstance(items, list):  # a tuple (draft 4): any of its item schemas
            kept = [item for item in items if item is not False]
            items = kept[0] if len(kept) == 1 else {"anyOf": kept} if kept else True
        if items is True or isinstance(items, Mapping):
            out["items"] = self.schema(items, depth + 1)
            out.setdefault("type", "array")
        _counts(node, out, "minItems", "maxItems")

    def _merge_all_of(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        """``allOf`` folded into the node: properties merged, required names joined, other keywords first seen."""
        parts = node.get("allOf")
        if not isinstance(parts, list):
            return node
        merged: dict[str, Any] = {k: v for k, v in node.items() if k != "allOf"}
        properties = dict(merged["properties"]) if isinstance(merged.get("properties"), Mapping) else {}
        required = list(merged["required"]) if isinstance(merged.get("required"), list) else []
        for part in parts:
            if isinstance(part, Mapping) and isinstance(part.get("$ref"), str):  # a base class, typically
                target = _pointer(self.root, part["$ref"])
                part = {**target, **part} if isinstance(target, Mapping) else part
            if not isinstance(part, Mapping):
                continue
            if isinstance(part.get("properties"), Mapping):
                properties.update(part["properties"])
            if isinstance(part.get("required"), list):
                required += part["required"]
            for key, value in part.items():
                if key != "$ref":
                    merged.setdefault(key, value)
        if properties:
            merged["properties"] = properties
        if required:
            merged["required"] = required
        return merged

    def _inline(self, ref: str, node: Mapping[str, Any], depth: int) -> dict[str, Any]:
        """A local ``$ref`` replaced by what it names (its siblings win); a recursive one by its bare type."""
        target = _pointer(self.root, ref)
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        if not isinstance(target, Mapping):
            return self.schema(siblings, depth)  # a remote or broken reference: what the node says besides it
        if ref in self.inlining:
            return self.schema({k: v for k, v in target.items() if k == "type"} | siblings, _MAX_DEPTH)
        self.inlining.append(ref)
        try:
            return self.schema({**target, **siblings}, depth + 1)
        finally:
            self.inlining.pop()


def _types(node: Mapping[str, Any]) -> list[str]:
    declared = node.get("type")
    names = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else []
    types = [t for t in dict.fromkeys(n for n in names if isinstance(n, str)) if t in TYPES]
    if node.get("nullable") is True and types and "null" not in types:  # OpenAPI 3.0's spelling
        types.append("null")
    return types


def _describe_default(node: Mapping[str, Any], out: dict[str, Any]) -> None:
    """A default, which strict servers refuse as a keyword, said in the description instead (when short)."""
    if "default" not in node:
        return
    try:
        shown = json.dumps(node["default"], ensure_ascii=False)
    except (TypeError, ValueError):
        return
    description = out.get("description", "")
    if len(shown) <= _MAX_DEFAULT_CHARS and "default" not in description.lower():
        out["description"] = f"{description.rstrip()} (default: {shown})".lstrip()


def _string(node: Mapping[str, Any], out: dict[str, Any], types: list[str]) -> None:
    if types and "string" not in types:
        return
    _counts(node, out, "minLength", "maxLength")
    if isinstance(node.get("format"), str) and node["format"] in FORMATS:
        out["format"] = node["format"]
    pattern = node.get("pattern")
    if isinstance(pattern, str) and not _UNSUPPORTED_PATTERN.search(pattern) and _compiles(pattern):
        out["pattern"] = pattern


def _integer(node: Mapping[str, Any], out: dict[str, Any], types: list[str]) -> None:
    """Bounds only on integers (a grammar spells out their digits), and only integral ones."""
    if "integer" not in types or "number" in types:
        return
    bounds = {key: int(node[key]) for key in _INTEGER_BOUNDS if _integral(node.get(key))}
    low = bounds.get("minimum", bounds.get("exclusiveMinimum"))
    high = bounds.get("maximum", bounds.get("exclusiveMaximum"))
    if low is None or high is None or low <= high:
        out.update(bounds)


def _counts(node: Mapping[str, Any], out: dict[str, Any], low_key: str, high_key: str) -> None:
    """A pair of non-negative integer limits (``minItems``/``maxItems``...), dropped when they contradict."""
    low, high = node.get(low_key), node.get(high_key)
    low = int(low) if _integral(low) and low >= 0 else None
    high = int(high) if _integral(high) and high >= 0 else None
    if low is not None and high is not None and low > high:
        return
    if low is not None:
        out[low_key] = low
    if high is not None:
        out[high_key] = high


def _integral(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer())


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def _unique(values: list[Any]) -> list[Any]:
    """``values`` without repeats (compared as JSON, so 1 and true stay apart), in order."""
    seen: set[str] = set()
    kept: list[Any] = []
    for value in values:
        try:
            key = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError):
            continue
        if key not in seen:
            seen.add(key)
            kept.append(value)
    return kept


def _pointer(root: Mapping[str, Any], ref: str) -> Any:
    """What a local reference (``#/$defs/name``, ``#/definitions/name``, ``#``) names in ``root``, or None."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else ():
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node
