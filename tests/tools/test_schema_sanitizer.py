"""The schema sanitizer for strict OpenAI-compatible servers: its output is checked against a strict meta-schema (the
JSON Schema subset llama.cpp's grammar converter reads) with the jsonschema library, for every built-in tool, for
schemas written to trip such servers, and for random ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import model_tools as mt
from tools.registry import registry
from tools.schema_sanitizer import FORMATS, TYPES, sanitize_definition, sanitize_parameters
from toolsets import TOOLSETS, create_custom_toolset

_COUNT = {"type": "integer", "minimum": 0}
_NODE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,  # any other keyword is one a strict server may refuse
    "properties": {
        "type": {"anyOf": [{"enum": list(TYPES)},
                           {"type": "array", "items": {"enum": list(TYPES)}, "minItems": 2, "uniqueItems": True}]},
        "title": {"type": "string"},
        "description": {"type": "string"},
        "properties": {"type": "object", "additionalProperties": {"$ref": "#/$defs/node"}},
        "required": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True},
        "additionalProperties": {"anyOf": [{"type": "boolean"}, {"$ref": "#/$defs/node"}]},
        "items": {"$ref": "#/$defs/node"},
        "minItems": _COUNT, "maxItems": _COUNT, "minLength": _COUNT, "maxLength": _COUNT,
        "anyOf": {"type": "array", "items": {"$ref": "#/$defs/node"}, "minItems": 1},
        "enum": {"type": "array", "minItems": 1, "uniqueItems": True},
        "const": {},
        "format": {"enum": sorted(FORMATS)},
        "pattern": {"type": "string", "not": {"pattern": r"\(\?|\\[A-Za-z0-9]"}},
        **{bound: {"type": "integer"} for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")},
    },
    # A grammar converter reads properties or anyOf, not both; integer bounds only on integers.
    "not": {"required": ["properties", "anyOf"]},
    "dependentSchemas": {bound: {"required": ["type"], "properties": {"type": {"const": "integer"}}}
                         for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")},
}
STRICT_PARAMETERS = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {"node": _NODE},
    "allOf": [{"$ref": "#/$defs/node"}],
    "required": ["type", "properties"],
    "properties": {"type": {"const": "object"}},
}
_STRICT = jsonschema.Draft202012Validator(STRICT_PARAMETERS)


def assert_strict(parameters: dict[str, Any]) -> None:
    """``parameters`` is in the strict subset: the meta-schema above, ``required`` names declared properties, and it
    is itself a valid JSON Schema."""
    errors = sorted(_STRICT.iter_errors(parameters), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    jsonschema.Draft202012Validator.check_schema(parameters)
    for node in _nodes(parameters):
        assert set(node.get("required", [])) <= set(node.get("properties", {})), node


def _nodes(node: Any) -> Iterator[dict[str, Any]]:
    if not isinstance(node, dict):
        return
    yield node
    for sub in node.get("properties", {}).values():
        yield from _nodes(sub)
    for key in ("items", "additionalProperties"):
        yield from _nodes(node.get(key))
    for sub in node.get("anyOf", []):
        yield from _nodes(sub)


@pytest.fixture
def builtin_definitions() -> list[dict[str, Any]]:
    registry.discover_builtin_tools()
    names = [n for n, e in registry.snapshot().items() if not e.toolset.startswith(("mcp-", "plugin-", "test-"))]
    return registry.get_definitions(names)


def test_the_strict_check_refuses_what_strict_servers_refuse() -> None:
    """The check can fail: each of these is a schema llama.cpp-style servers reject or misread."""
    bad = [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]},
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "a"]},
        {"type": "object", "properties": {}, "$schema": "http://json-schema.org/draft-07/schema#"},
        {"type": "object", "properties": {"a": {"type": "integer", "default": 1}}},
        {"type": "object", "properties": {"a": {"type": "string", "format": "email"}}},
        {"type": "object", "properties": {"a": {"type": "string", "pattern": r"^\d+$"}}},
        {"type": "object", "properties": {"a": {"type": "number", "minimum": 0.5}}},
        {"type": "object", "properties": {"a": {"type": "any"}}},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}},
        {"type": "object"},
    ]
    for schema in bad:
        with pytest.raises(AssertionError):
            assert_strict(schema)


def test_every_builtin_tool_schema_passes_after_sanitizing(builtin_definitions: list[dict[str, Any]]) -> None:
    assert len(builtin_definitions) >= 10
    for definition in builtin_definitions:
        clean = sanitize_definition(definition)
        assert clean["function"]["name"] == definition["function"]["name"]
        assert clean["function"]["description"] == definition["function"]["description"]
        assert_strict(clean["function"]["parameters"])


def test_sanitized_builtin_schemas_still_accept_valid_calls(builtin_definitions: list[dict[str, Any]]) -> None:
    """Sanitizing only loosens: what a tool accepted it still accepts (its required arguments given)."""
    for definition in builtin_definitions:
        original = definition["function"]["parameters"]
        required = {name: _sample(original["properties"][name]) for name in original.get("required", [])}
        jsonschema.validate(required, original)
        jsonschema.validate(required, sanitize_definition(definition)["function"]["parameters"])


def _sample(schema: dict[str, Any]) -> Any:
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "string")
    kind = kind[0] if isinstance(kind, list) else kind
    return {"string": "x", "integer": schema.get("minimum", 1), "number": 1.5, "boolean": True, "null": None,
            "array": [_sample(schema["items"])] * schema.get("minItems", 1) if "items" in schema else [],
            "object": {k: _sample(schema["properties"][k]) for k in schema.get("required", [])}}[kind]


def test_what_the_sanitizer_changes() -> None:
    messy = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                            "required": ["x", "y"]},
                  "Tree": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Tree"}}}},
        "properties": {
            "when": {"type": "string", "format": "date-time", "examples": ["2024-01-01T00:00:00Z"]},
            "mail": {"type": "string", "format": "email", "pattern": r"^\S+@\S+$"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$", "minLength": 5, "maxLength": 2},
            "count": {"type": "integer", "minimum": 1.0, "maximum": 9.5, "default": 3},
            "ratio": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "a"]}, "uniqueItems": True,
                     "minItems": 1, "maxItems": 5},
            "where": {"$ref": "#/$defs/Point", "description": "A point."},
            "tree": {"$ref": "#/$defs/Tree"},
            "either": {"oneOf": [{"type": "string"}, {"type": "integer", "nullable": True}, {"not": {}}]},
            "merged": {"allOf": [{"$ref": "#/$defs/Point"},
                                 {"properties": {"z": {"type": "integer"}}, "required": ["z", "w"]}]},
            "mixed": {"type": "object", "properties": {"a": {"type": "string"}},
                      "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
            "odd": {"type": ["string", "whatever", "string"]},
            "tuple": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]},
            "gone": False,
        },
        "required": ["when", "when", "ghost", "gone"],
        "additionalProperties": False,
        "if": {"properties": {"when": {"const": "x"}}}, "then": {"required": ["mail"]},
    }
    clean = sanitize_parameters(messy)
    assert_strict(clean)
    props = clean["properties"]
    assert clean["type"] == "object" and clean["required"] == ["when"] and clean["additionalProperties"] is False
    assert "gone" not in props and "$defs" not in clean and "if" not in clean
    assert props["when"] == {"type": "string", "format": "date-time"}
    assert props["mail"] == {"type": "string"}  # email and \S are beyond a grammar
    assert props["code"] == {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}  # contradictory lengths dropped
    assert props["count"] == {"type": "integer", "description": "(default: 3)", "minimum": 1}
    assert props["ratio"] == {"type": "number"}
    assert props["tags"] == {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "minItems": 1,
                             "maxItems": 5}
    assert props["where"] == {"type": "object", "description": "A point.", "required": ["x", "y"],
                              "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
    assert props["tree"] == {"type": "object", "properties": {"child": {"type": "object"}}}  # recursion: cut
    assert props["either"] == {"anyOf": [{"type": "string"}, {"type": ["integer", "null"]}, {}]}
    assert props["merged"]["required"] == ["x", "y", "z"] and set(props["merged"]["properties"]) == {"x", "y", "z"}
    assert props["mixed"] == {"type": "object", "properties": {"a": {"type": "string"}}}
    assert props["odd"] == {"type": "string"}
    assert props["tuple"] == {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}
    assert messy["required"] == ["when", "when", "ghost", "gone"]  # the input is left alone


def test_parameters_always_come_out_an_object_with_properties() -> None:
    assert sanitize_parameters(None) == {"type": "object", "properties": {}}
    assert sanitize_parameters({"type": "object"}) == {"type": "object", "properties": {}}
    shapes = sanitize_parameters({"anyOf": [{"properties": {"url": {"type": "string"}}, "required": ["url"]},
                                            {"properties": {"path": {"type": "string"}}, "required": ["path"]}]})
    assert shapes == {"type": "object", "properties": {"url": {"type": "string"}, "path": {"type": "string"}}}
    nested = sanitize_parameters({"type": "object", "properties": {"arguments": {"type": "object"}}})
    assert nested["properties"]["arguments"] == {"type": "object"}  # a free-form object stays free-form


_keyword = st.sampled_from(["type", "properties", "required", "items", "anyOf", "oneOf", "allOf", "enum", "const",
                            "default", "format", "pattern", "minimum", "maximum", "minLength", "maxItems", "$ref",
                            "$schema", "nullable", "additionalProperties", "not", "description", "title", "$defs"])
_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-3, 3) | st.sampled_from(
        [*TYPES, "any", "email", "date", "#", "#/$defs/a", "#/properties/x", r"^\d$", "^[a-z]+$", "a", "x"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keyword | st.sampled_from(["a", "x"]), inner,
                                                                 max_size=5),
    max_leaves=25)


@settings(max_examples=400, deadline=None)
@given(schema=st.dictionaries(_keyword, _value, max_size=6))
def test_any_schema_comes_out_strict(schema: dict[str, Any]) -> None:
    assert_strict(sanitize_parameters(schema))
    json.dumps(sanitize_parameters(schema))


@pytest.fixture
def scratch_toolset() -> Iterator[str]:
    """Three built-in tools and a non-core one with a schema strict servers refuse."""
    registry.discover_builtin_tools()
    registry.register("t_strict_extra", "test-strict", {"description": "An extra tool.", "parameters": {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "properties": {"q": {"type": "string", "format": "uri"}}, "required": ["q", "q", "nope"]}},
        lambda args, **ctx: "ok")
    create_custom_toolset("test-strict", "", ["read_file", "search_files", "terminal", "t_strict_extra"])
    yield "test-strict"
    registry.deregister("t_strict_extra")
    del TOOLSETS["test-strict"]
    mt.clear_definition_cache()


def test_the_plan_sanitizes_on_request_and_caches_both_kinds(scratch_toolset: str) -> None:
    mt.clear_definition_cache()
    loose = mt.get_tool_plan([scratch_toolset])
    strict = mt.get_tool_plan([scratch_toolset], strict_schemas=True)
    assert mt.cache_info()["misses"] == 2
    assert mt.get_tool_plan([scratch_toolset], strict_schemas=True).definitions == strict.definitions
    assert mt.cache_info()["hits"] == 1
    assert [d["function"]["name"] for d in strict.definitions] == [d["function"]["name"] for d in loose.definitions]
    assert strict.definitions != loose.definitions  # e.g. search_files' default moved into its description
    for definition in strict.definitions:
        assert_strict(definition["function"]["parameters"])
    tight = mt.ToolSearchConfig(context_window_tokens=10, threshold=0.1)
    bridged = mt.get_tool_plan([scratch_toolset], tool_search=tight, strict_schemas=True)
    assert bridged.deferred == ("t_strict_extra",)
    assert {"tool_search", "tool_call"} <= {d["function"]["name"] for d in bridged.definitions}
    for definition in bridged.definitions:
        assert_strict(definition["function"]["parameters"])
