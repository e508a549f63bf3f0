"""Tool-call grammars on the default model's tokenizer (skipped when install.sh has not
prepared it): `tool_choice: auto` with strict tools or custom tools with a Lark / regex input
grammar (free text, or calls whose input the grammar holds), and forced custom-tool calls."""
from __future__ import annotations

import json

import pytest

from ninfer_engine.chat.tool_calls import ToolCall, ToolCallParser
from ninfer_engine.cli.flags import default_artifact
from ninfer_engine.constrained import (
    GrammarError,
    compile_constraint,
    custom_input_grammar,
    json_schema_grammar,
    optional_call_grammar,
    tool_call_grammar,
)
from ninfer_engine.constrained.grammar import ToolSpec

MODEL = default_artifact()
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} is missing")
N = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 99}},
     "required": ["n"], "additionalProperties": False}
COMMAND = 'start: ("ls" | "cat") " " PATH\nPATH: /[a-z_.\\/]{1,20}/\n'
CALL = '<tool_call>\n{"name": "f", "arguments": {"n": 5}}\n</tool_call>'
SHELL = ("<tool_call>\n<function=shell>\n<parameter=input>\ncat a/b.txt\n</parameter>\n"
         "</function>\n</tool_call>")


@pytest.fixture(scope="module")
def tokenizer():
    from ninfer_engine.artifact import open_artifact
    from ninfer_engine.tokenizer import Tokenizer

    with open_artifact(MODEL) as artifact:
        return Tokenizer.from_artifact(artifact)


@pytest.fixture(scope="module")
def tools():
    return [ToolSpec("f", N, strict=True),
            ToolSpec("shell", {}, grammar=custom_input_grammar("lark", COMMAND)),
            ToolSpec("loose", N)]  # not strict: as free as without a grammar, under auto


def follows(tokenizer, grammar: str, text: str) -> bool:
    """Whether `text` (tokenized as the model would write it) is a complete output of
    `grammar`."""
    constraint = compile_constraint(tokenizer, grammar)
    lead = len(tokenizer.encode(""))
    for token in tokenizer.encode(text)[lead:]:
        if not constraint.matcher.consume_token(token):
            return False
    return constraint.matcher.is_accepting()


@pytest.mark.parametrize("text, ok", [
    ("Just text, even < and <tool.", True),
    ("Let me check. " + CALL, True),
    (CALL + "\n" + SHELL, True),  # parallel calls
    ("Calling. " + SHELL, True),
    (CALL.replace("5", "500"), False),  # over the schema's maximum
    (CALL.replace('"f"', '"g"'), False),  # no such tool
    (SHELL.replace("cat", "rm"), False),  # outside the custom tool's grammar
    (CALL + " and more text", False),  # nothing after the calls
    # a non-strict tool: any arguments, in JSON or in Qwen3.5's XML form
    ('<tool_call>\n{"name": "loose", "arguments": {"n": "many", "x": [1]}}\n</tool_call>', True),
    ("<tool_call>\n<function=loose>\n<parameter=n>\nmany\n</parameter>\n</function>\n"
     "</tool_call>", True),
    ("<tool_call>\n<function=f>\n<parameter=n>\n500\n</parameter>\n</function>\n</tool_call>",
     False),  # a strict tool only in its schema's JSON
])
def test_auto_grammar_allows_text_or_valid_calls(tokenizer, tools, text, ok):
    assert follows(tokenizer, optional_call_grammar(tools, parallel=True), text) == ok


def test_auto_grammar_without_parallel_calls_allows_one(tokenizer, tools):
    grammar = optional_call_grammar(tools, parallel=False)
    assert follows(tokenizer, grammar, "Ok. " + CALL)
    assert not follows(tokenizer, grammar, CALL + "\n" + SHELL)


def test_auto_grammar_with_a_response_format(tokenizer, tools):
    grammar = optional_call_grammar(tools, parallel=False, answer=json_schema_grammar(N))
    assert follows(tokenizer, grammar, '{"n": 7}')
    assert follows(tokenizer, grammar, CALL)
    assert not follows(tokenizer, grammar, "free text")


def test_auto_grammar_refuses_a_strict_schema_the_library_cannot_compile():
    with pytest.raises(GrammarError):
        optional_call_grammar([ToolSpec("f", {"type": "x"}, strict=True)], parallel=True)


def test_forced_custom_call_is_read_back_with_its_raw_input(tokenizer, tools):
    grammar = tool_call_grammar(tools, parallel=False)
    assert follows(tokenizer, grammar, SHELL) and follows(tokenizer, grammar, CALL)
    assert not follows(tokenizer, grammar, "text")
    parser = ToolCallParser([{"type": "function", "function": {
        "name": "shell", "parameters": {"type": "object",
                                        "properties": {"input": {"type": "string"}}}}}])
    assert parser.feed(SHELL) + parser.flush() == [
        ToolCall("shell", '{"input": "cat a/b.txt"}')]


def test_custom_input_grammars():
    custom_input_grammar("regex", r"\d{1,3}/\d")
    with pytest.raises(GrammarError, match="unknown name"):
        custom_input_grammar("lark", "start: foo")
    with pytest.raises(GrammarError, match="not supported"):
        custom_input_grammar("ebnf", "x")


def test_objects_that_list_properties_are_closed(tokenizer):
    """An object schema that names its properties and says nothing of others takes no other
    key (xgrammar's default, as vLLM serves it), nested and through $defs; an object that
    allows others explicitly, or lists none, still takes them."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"},
                                               "b": {"type": "object"},
                                               "c": {"type": "object", "properties": {},
                                                     "additionalProperties": True}},
              "$defs": {"A": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
    grammar = json_schema_grammar(schema, strict=False)
    assert follows(tokenizer, grammar, '{"a": {"x": 1}, "b": {"k": 2}, "c": {"k": 3}}')
    assert not follows(tokenizer, grammar, '{"a": {"x": 1}, "z": 1}')
    assert not follows(tokenizer, grammar, '{"a": {"x": 1, "": null}}')
    forced = tool_call_grammar([ToolSpec("f", schema["$defs"]["A"])], parallel=False)
    assert follows(tokenizer, forced, '<tool_call>\n{"name": "f", "arguments": {"x": 1}}'
                                      '\n</tool_call>')
    assert not follows(tokenizer, forced, '<tool_call>\n{"name": "f", "arguments": '
                                          '{"x": 1, "y": 2}}\n</tool_call>')


def test_a_named_openai_choice_is_one_call_whatever_parallel_tool_calls_says(tokenizer, tools):
    """OpenAI's named `tool_choice` is "exactly one specific function" (a second call, cut by
    the token limit, came back as text beside the call: tests/serve/test_real_client_tools.py);
    `required` and Anthropic's named `tool` choice keep `parallel_tool_calls`."""
    from ninfer_http.forced_tools import ForcedCall, call_grammar

    offered = [{"type": "function", "function": {"name": "shell", "parameters": {}}}]
    grammars = {"shell": custom_input_grammar("lark", COMMAND)}
    named = call_grammar(ForcedCall(frozenset({"shell"}), once=True), offered, True,
                         frozenset(), "tool_choice", grammars)
    anthropic = call_grammar(ForcedCall(frozenset({"shell"})), offered, True, frozenset(),
                             "tool_choice", grammars)
    required = call_grammar(ForcedCall(), offered, True, frozenset(), "tool_choice", grammars)
    assert follows(tokenizer, named, SHELL) and not follows(tokenizer, named, SHELL + "\n" + SHELL)
    for grammar in (anthropic, required):
        assert follows(tokenizer, grammar, SHELL + "\n" + SHELL)


@pytest.fixture(scope="module")
def qwen_tokenizer():
    """The real Qwen3.5 tokenizer (synth's), whose `<tool_call>` and `</tool_call>` are single
    added tokens."""
    from ninfer_engine.artifact import qwen_resources
    from ninfer_engine.tokenizer import Tokenizer

    resources = qwen_resources.resources("qwen3_5")
    return Tokenizer.from_json(resources["tokenizer.json"],
                               json.loads(resources["tokenizer_config.json"]))


def test_call_tags_that_are_tokens_are_named_as_tokens(qwen_tokenizer, tools):
    """Spelled as text, the tags got a mask that allowed only the `<tool_call>` token, which
    the matcher then refused (every forced call on a Qwen model failed): compiled for such a
    tokenizer, the grammar names the tokens, so a call written as the model writes it (the
    tokens) follows; the default model's tokenizer keeps the text (the tests above)."""
    assert len(qwen_tokenizer.encode("<tool_call>")) == 1
    assert follows(qwen_tokenizer, tool_call_grammar(tools[:1], parallel=False), CALL)
    assert follows(qwen_tokenizer, optional_call_grammar(tools, parallel=False),
                   "Let me check. " + CALL)
    assert follows(qwen_tokenizer, optional_call_grammar(tools, parallel=False), "Just text.")
    assert not follows(qwen_tokenizer, tool_call_grammar(tools[:1], parallel=False),
                       CALL.replace("5", "500"))
