"""Tool-call extraction over every chunk boundary (ninfer_engine.chat.tool_calls)."""
from __future__ import annotations

import json
import random

import pytest

from ninfer_engine.chat.tool_calls import ToolCall, ToolCallParser

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "ratio": {"type": "number"},
            "metric": {"type": "boolean"},
            "extra": {"type": "null"},
            "filters": {"type": "object"},
            "tags": {"type": "array"},
            "zip": {"type": ["string", "null"]},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        }}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
]

JSON_CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
             "\n</tool_call>")
XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=days>\n5\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
            "</function>\n</tool_call>")


def parse(text: str, cuts: list[int]) -> tuple[str, list[ToolCall]]:
    parser = ToolCallParser(TOOLS)
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    items = [item for piece in pieces for item in parser.feed(piece)] + parser.flush()
    assert all(item for item in items if isinstance(item, str)), "empty text pieces"
    content = "".join(item for item in items if isinstance(item, str))
    return content, [item for item in items if isinstance(item, ToolCall)]


def every_split(text: str) -> list[tuple[str, list[ToolCall]]]:
    """One character at a time, every single cut, and random multi-cuts."""
    rng = random.Random(11)
    cut_sets = [list(range(1, len(text)))] + [[i] for i in range(1, len(text))]
    cut_sets += [sorted(rng.sample(range(1, len(text)), rng.randint(1, 8))) for _ in range(60)]
    return [parse(text, cuts) for cuts in cut_sets]


def only_result(text: str) -> tuple[str, list[tuple[str, dict]]]:
    results = {(content, tuple((c.name, c.arguments) for c in calls))
               for content, calls in every_split(text)}
    assert len(results) == 1, results
    content, calls = results.pop()
    return content, [(name, json.loads(arguments)) for name, arguments in calls]


def test_json_call_after_text():
    assert only_result("Let me check.\n\n" + JSON_CALL) == (
        "Let me check.", [("get_weather", {"city": "Paris", "days": 3})])


def test_xml_call_is_typed_by_the_schema():
    assert only_result(XML_CALL) == (
        "", [("get_weather", {"city": "New York", "days": 5, "metric": True})])


def test_several_calls_of_both_forms_in_order():
    content, calls = only_result(JSON_CALL + "\n" + XML_CALL + "\n" + JSON_CALL + "\n")
    assert content == ""
    assert [name for name, _ in calls] == ["get_weather"] * 3
    assert calls[1][1]["city"] == "New York"


def test_empty_arguments_do_not_drop_later_calls():
    text = ('<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>\n'
            "<tool_call>\n<function=noop>\n</function>\n</tool_call>\n" + JSON_CALL)
    assert only_result(text)[1] == [("noop", {}), ("noop", {}), ("get_weather",
                                                                  {"city": "Paris", "days": 3})]


@pytest.mark.parametrize("text", [
    "Use the <tool> tag or <tool_calls> in prose; a < b.",
    "Ends with a partial tag <tool_ca",
    "<tool_call",
    "Text <tool_call> then <more> text",
])
def test_false_alarms_are_released_as_text(text):
    content, calls = only_result(text)
    assert calls == []
    assert content == text


@pytest.mark.parametrize("body", [
    "{not json}",
    '{"arguments": {"a": 1}}',
    '{"name": "f", "arguments": [1, 2]}',
    '{"name": "f", "arguments": {"x": NaN}}',
    "<function=f>\n<parameter=a>\n1\n</parameter>\nstray\n</function>",
    "<function=f>\n<parameter=a>\n1\n",
    "plain words",
])
def test_malformed_calls_are_released_as_text(body):
    text = f"Before\n<tool_call>{body}</tool_call> after"
    assert only_result(text) == (text, [])


def test_unclosed_call_is_kept_only_when_complete():
    assert only_result('<tool_call>\n{"name": "noop", "arguments": {}}\n')[1] == [("noop", {})]
    truncated = '<tool_call>\n{"name": "noop", "argu'
    assert only_result(truncated) == (truncated, [])


@pytest.mark.parametrize("cut", [
    '<tool_call>\n{"name": "noop", "arguments": {}}',  # the body parses, the call never closed
    '<tool_call>\n{"name": "noop", "argu',
    "<tool_call>\n<function=noop>\n</function>\n",
])
def test_a_call_cut_by_the_token_limit_is_text(cut):
    text = "Let me see. " + JSON_CALL + "\n" + cut
    parser = ToolCallParser(TOOLS)
    items = parser.feed(text) + parser.flush(truncated=True)
    calls = [item for item in items if isinstance(item, ToolCall)]
    assert [c.name for c in calls] == ["get_weather"]  # the closed call before the cut stays
    # blanks after a call are dropped, as always; the cut call is released as written
    assert "".join(i for i in items if isinstance(i, str)) == "Let me see." + cut


def test_an_abandoned_call_does_not_hide_the_next_one():
    text = "<tool_call>\n{\"name\": <tool_call>" + JSON_CALL[len("<tool_call>"):]
    content, calls = only_result(text)
    assert content == "<tool_call>\n{\"name\": "
    assert [name for name, _ in calls] == ["get_weather"]


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


# Issue 21: under a forced call's grammar SmolLM2 wrote the end tag into an argument string.
# As JSON text: tags, an escaped quote and an escaped backslash just before the string ends.
INSIDE = '}}}</tool_call> \\"</tool_call>\\\\'
ESCAPED_CITY = json.loads(f'"{INSIDE}"')


def test_an_end_tag_inside_an_argument_string_does_not_end_the_call():
    assert ESCAPED_CITY == '}}}</tool_call> "</tool_call>\\'
    text = "Checking.\n" + _call("get_weather", f'{{"city": "{INSIDE}", "days": 2}}')
    assert only_result(text) == (
        "Checking.", [("get_weather", {"city": ESCAPED_CITY, "days": 2})])


def test_nested_arguments_with_tags_and_brackets_in_strings():
    arguments = {"filters": {"a": [1, {"b": "</tool_call>]}"}], "c": {}}, "tags": ["x", "{"]}
    text = _call("get_weather", json.dumps(arguments))
    assert only_result(text) == ("", [("get_weather", arguments)])


def test_two_calls_in_a_row_with_tags_in_their_strings():
    first = _call("get_weather", f'{{"city": "{INSIDE}"}}')
    second = _call("noop", '{"note": "<tool_call>x</tool_call>"}')
    assert only_result(first + second + "\nDone.") == (
        "Done.", [("get_weather", {"city": ESCAPED_CITY}),
                  ("noop", {"note": "<tool_call>x</tool_call>"})])


def test_an_unbalanced_quote_ends_the_call_at_the_first_tag_as_before():
    # The quote after "get_weather" is missing: every later tag is "inside a string", so only
    # the end of the output tells the call is malformed; it is text up to its first tag.
    bad = '<tool_call>{"name": "get_weather, "arguments": {}}</tool_call>'
    text = "Before\n" + bad + " after\n" + JSON_CALL
    assert only_result(text) == ("Before\n" + bad + " after",
                                 [("get_weather", {"city": "Paris", "days": 3})])
    parser = ToolCallParser(TOOLS)
    items = parser.feed(text) + parser.flush(truncated=True)
    assert items == ["Before", "\n" + bad, " after", ToolCall("get_weather", json.dumps(
        {"city": "Paris", "days": 3}))]


def test_a_body_that_parses_but_never_closed_outside_a_string():
    text = _call("noop", '{"a": "</tool_call>"}')[:-len("\n</tool_call>")]
    assert only_result(text) == ("", [("noop", {"a": "</tool_call>"})])
    parser = ToolCallParser(TOOLS)  # cut by the token limit: text as written
    assert "".join(parser.feed(text) + parser.flush(truncated=True)) == text


def test_text_after_a_call_is_kept():
    assert only_result(JSON_CALL + "\n\nDone.") == (
        "Done.", [("get_weather", {"city": "Paris", "days": 3})])


def test_markup_is_never_released_before_it_is_decided():
    text = "Checking.\n" + XML_CALL
    for content, _ in every_split(text):
        assert "<" not in content
    parser = ToolCallParser(TOOLS)
    assert parser.feed("Hi <tool_") == ["Hi"]
    assert parser.feed("x") == [" <tool_x"]


@pytest.mark.parametrize("raw, expected", [
    ("7", 7), ("7.0", 7), ("-3", -3), ("seven", "seven"), ("7.5", "7.5"),
])
def test_integer_values(raw, expected):
    assert _xml_arguments("days", raw) == {"days": expected}


@pytest.mark.parametrize("name, raw, expected", [
    ("ratio", "0.25", 0.25), ("ratio", "2", 2), ("ratio", "NaN", "NaN"),
    ("metric", "False", False), ("metric", "yes", "yes"),
    ("extra", "null", None),
    ("filters", '{"a": [1, 2]}', {"a": [1, 2]}), ("filters", "[1]", "[1]"),
    ("tags", '["x", "y"]', ["x", "y"]),
    ("city", "42", "42"), ("city", "  spaced\nlines ", "  spaced\nlines "),
    ("zip", "null", None), ("zip", "75001", "75001"),
    ("limit", "10", 10), ("limit", "null", None),
    ("unknown", "5", "5"),
])
def test_values_typed_by_schema(name, raw, expected):
    assert _xml_arguments(name, raw) == {name: expected}


def test_json_strings_are_typed_but_json_values_are_kept():
    text = ('<tool_call>{"name": "get_weather", "arguments": '
            '{"days": "4", "metric": "true", "city": 12, "other": "5"}}</tool_call>')
    assert only_result(text)[1] == [
        ("get_weather", {"days": 4, "metric": True, "city": 12, "other": "5"})]


def test_json_arguments_given_as_a_string():
    text = '<tool_call>{"name": "noop", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert only_result(text)[1] == [("noop", {"a": 1})]


def test_calls_of_unknown_tools_are_reported_untyped():
    text = ("<tool_call>\n<function=other>\n<parameter=n>\n1\n</parameter>\n</function>\n"
            "</tool_call>")
    assert only_result(text)[1] == [("other", {"n": "1"})]


def _xml_arguments(name: str, raw: str) -> dict:
    text = (f"<tool_call>\n<function=get_weather>\n<parameter={name}>\n{raw}\n</parameter>\n"
            "</function>\n</tool_call>")
    content, calls = only_result(text)
    assert content == ""
    return calls[0][1]
