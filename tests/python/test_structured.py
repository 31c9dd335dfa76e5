"""Structured outputs on llguidance: response_format json_schema (the OpenAI SDK's parse() with
a pydantic model, and a corpus of schemas), strict tool arguments, frigg's regex and grammar
formats, and the schemas refused. The server runs a random-weight fixture at temperature 0.9,
so every reply's structure comes from the constraint, not from the model; each is checked by
the `jsonschema` package."""

import json
import re

import jsonschema
import pytest
from harness import KEY, Server, medium_model

SEEDS = (1, 2, 3)
ASK = [{"role": "user", "content": "Svar i JSON."}]


@pytest.fixture(scope="module")
def server():
    # the hidden-256 model: random weights and the fixture vocabulary, 1,024 positions of room
    s = Server("--api-key", KEY, "--slots", "4", "--queue", "16", model=medium_model(), ctx=1024)
    yield s
    assert s.stop() == 0


def validate(instance, schema):
    jsonschema.validate(instance, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def obj(props, required=None, **extra):
    return {"type": "object", "properties": props, "required": list(props) if required is None else required, "additionalProperties": False, **extra}


S = {"type": "string", "maxLength": 12}
SCHEMAS = {
    "one string": obj({"name": {"type": "string"}}),
    "bounded string": obj({"name": {"type": "string", "minLength": 2, "maxLength": 8}}),
    "integer bounds": obj({"age": {"type": "integer", "minimum": 18, "maximum": 99}}),
    "exclusive number": obj({"p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}}),
    "negative integers": obj({"n": {"type": "integer", "maximum": -5}}),
    "boolean and null": obj({"ok": {"type": "boolean"}, "nothing": {"type": "null"}}),
    "string enum": obj({"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}),
    "mixed enum": obj({"v": {"enum": [1, "two", None, True]}}),
    "const": obj({"kind": {"const": "point"}, "x": {"type": "integer"}}),
    "optional keys": obj({"a": {"type": "integer"}, "b": S, "c": {"type": "boolean"}}, required=["b"]),
    "all optional": obj({"a": {"type": "integer"}, "b": S}, required=[]),
    "nested object": obj({"user": obj({"name": S, "address": obj({"city": S, "zip": {"type": "string", "pattern": "^[0-9]{4}$"}})})}),
    "array of integers": obj({"xs": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4}}),
    "array of objects": obj({"items": {"type": "array", "items": obj({"id": {"type": "integer"}, "tag": S}), "maxItems": 3}}),
    "empty array allowed": obj({"xs": {"type": "array", "items": S, "maxItems": 2}}),
    "exact array length": obj({"rgb": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}, "minItems": 3, "maxItems": 3}}),
    "anyOf with null": obj({"nick": {"anyOf": [S, {"type": "null"}]}}),
    "type list": obj({"v": {"type": ["integer", "string"], "maxLength": 5}}),
    "anyOf of objects": obj({"shape": {"anyOf": [obj({"r": {"type": "number"}}), obj({"w": {"type": "integer"}, "h": {"type": "integer"}})]}}),
    "oneOf": obj({"id": {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": "^id-[a-z]{3}$"}]}}),
    "$ref and $defs": {**obj({"home": {"$ref": "#/$defs/place"}, "work": {"$ref": "#/$defs/place"}}), "$defs": {"place": obj({"city": S, "floor": {"type": "integer", "minimum": 0, "maximum": 50}})}},
    "recursive $ref": {**obj({"root": {"$ref": "#/$defs/node"}}), "$defs": {"node": obj({"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}})}},
    "pattern": obj({"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}}),
    "unanchored pattern": obj({"s": {"type": "string", "pattern": "ab", "maxLength": 6}}),
    "date format": obj({"d": {"type": "string", "format": "date"}}),
    "email format": obj({"e": {"type": "string", "format": "email"}}),
    "uuid format": obj({"u": {"type": "string", "format": "uuid"}}),
    "ipv4 format": obj({"ip": {"type": "string", "format": "ipv4"}}),
    "date-time format": obj({"t": {"type": "string", "format": "date-time"}}),
    "many keys": obj({k: {"type": "integer", "minimum": 0, "maximum": 9} for k in "abcdefgh"}),
    "additional properties allowed": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "maxProperties": 3},
    "top-level array": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    "top-level enum": {"enum": ["ja", "nej"]},
    "multipleOf": obj({"n": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}}),
    "description and title only annotate": {"title": "T", "description": "D", **obj({"x": {"type": "integer", "description": "an x"}})},
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_replies_validate(server, name):
    schema = SCHEMAS[name]
    rf = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}
    c = server.client()
    for seed in SEEDS:
        r = c.chat.completions.create(model="x", messages=ASK, response_format=rf, max_tokens=200, temperature=0.9, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "stop", (name, seed, ch.message.content)
        validate(json.loads(ch.message.content), schema)


def test_every_choice_and_the_stream_validate(server):
    schema = SCHEMAS["nested object"]
    rf = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    c = server.client()
    r = c.chat.completions.create(model="x", messages=ASK, response_format=rf, max_tokens=200, temperature=0.9, seed=5, n=3)
    assert len(r.choices) == 3
    for ch in r.choices:
        validate(json.loads(ch.message.content), schema)
    chunks = list(c.chat.completions.create(model="x", messages=ASK, response_format=rf, max_tokens=200, temperature=0.9, seed=5, n=3, stream=True))
    for i in range(3):
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices and ch.choices[0].index == i)
        assert text == r.choices[i].message.content


def test_a_tight_budget_still_closes_the_reply(server):
    """Near the end of max_tokens the reply is steered onto the shortest completion found."""
    schema = obj({"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}})
    rf = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    for seed in SEEDS:
        r = server.client().chat.completions.create(model="x", messages=ASK, response_format=rf, max_tokens=24, temperature=0.9, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "stop" and r.usage.completion_tokens <= 24, ch
        validate(json.loads(ch.message.content), schema)


def test_openai_sdk_parse_with_a_pydantic_model(server):
    from typing import Literal, Optional

    from pydantic import BaseModel, Field

    class Address(BaseModel):
        city: str = Field(max_length=20)
        zip: str = Field(pattern=r"^[0-9]{4}$")

    class Person(BaseModel):
        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=120)
        role: Literal["admin", "user"]
        nickname: Optional[str] = Field(max_length=10)
        address: Address

    c = server.client()
    parse = getattr(c.chat.completions, "parse", None) or c.beta.chat.completions.parse
    for seed in SEEDS:
        r = parse(model="x", messages=ASK, response_format=Person, max_tokens=200, temperature=0.9, seed=seed)
        p = r.choices[0].message.parsed
        assert isinstance(p, Person) and isinstance(p.address, Address), r
        assert p.role in ("admin", "user") and 0 <= p.age <= 120


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "add", "parameters": obj({"a": {"type": "integer"}, "b": {"type": "integer"}})}},
]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_strict_tool_arguments_validate(server, choice):
    c = server.client()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for seed in SEEDS:
        r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Vejret i Aarhus?"}], tools=TOOLS, tool_choice=choice, max_tokens=120, temperature=0.9, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
        for call in ch.message.tool_calls:
            if isinstance(choice, dict):
                assert call.function.name == "get_weather"
            validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_non_strict_tools_accept_any_well_formed_arguments(server):
    loose = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}, "strict": False}}]
    r = server.client().chat.completions.create(model="x", messages=ASK, tools=loose, tool_choice="required", max_tokens=60, temperature=0.9, seed=1)
    assert isinstance(json.loads(r.choices[0].message.tool_calls[0].function.arguments), dict)


def test_regex_and_grammar_formats(server):
    c = server.client()
    rx = r"[A-Z][a-z]{2,5} [0-9]{2}"
    for seed in SEEDS:
        r = c.chat.completions.create(model="x", messages=ASK, response_format={"type": "regex", "regex": rx}, max_tokens=40, temperature=0.9, seed=seed)
        assert re.fullmatch(rx, r.choices[0].message.content), r.choices[0].message.content
    lark = 'start: "svar: " ANSWER "."\nANSWER: "ja" | "nej" | /[0-9]{1,3}/'
    for seed in SEEDS:
        r = c.chat.completions.create(model="x", messages=ASK, response_format={"type": "grammar", "grammar": lark}, max_tokens=40, temperature=0.9, seed=seed)
        assert re.fullmatch(r"svar: (ja|nej|[0-9]{1,3})\.", r.choices[0].message.content), r.choices[0].message.content


@pytest.mark.parametrize(
    "response_format,needle",
    [
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "if": {"type": "object"}, "then": {}}}}, "if"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string", "format": "not-a-format"}}}, "not-a-format"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"$ref": "#/$defs/missing"}}}, "missing"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": [1, 2]}}, "schema"),
        ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}, "name"),
        ({"type": "regex", "regex": "([a-z"}, "regex"),
        ({"type": "grammar", "grammar": "start: undefined_rule"}, "undefined_rule"),
    ],
)
def test_invalid_or_unsupported_constraints_are_400(server, response_format, needle):
    status, _, body = server.post("/v1/chat/completions", json.dumps({"model": "x", "messages": ASK, "response_format": response_format}).encode())
    err = json.loads(body)["error"]
    assert status == 400 and needle in err["message"], err


def test_unsupported_tool_schema_keywords_are_400(server):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "contentSchema": {}}}}}}]
    status, _, body = server.post("/v1/chat/completions", json.dumps({"model": "x", "messages": ASK, "tools": bad}).encode())
    err = json.loads(body)["error"]
    assert status == 400 and "contentSchema" in err["message"] and "strict" in err["message"], err
