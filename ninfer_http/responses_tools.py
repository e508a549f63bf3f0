"""Responses `tools` and `tool_choice` -> the template's function tools (contract §6, revised).

Function tools and `namespace` groups of them are shown as they are (namespaced names flattened
to `<namespace>.<name>`). A `custom` (freeform) tool is shown as a function taking one string,
`input`, with its grammar in the description; its calls come back as `custom_tool_call` items.
`local_shell` is shown as a function with the documented exec parameters and comes back as a
`local_shell_call`. Hosted tools this server cannot run (`web_search`, `file_search`, ...) are
left out and logged once. `tool_choice` `required`, a named tool or `allowed_tools` in mode
`required` force a call through a grammar (forced_tools.py). A custom tool whose `format` is a
Lark or regex grammar has its input held to it (its call is then written in the XML form with
the raw input); so are `strict` functions' arguments to their schema, under `auto` too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import invalid_value, unsupported
from .forced_tools import ForcedCall, auto_grammar, call_grammar, input_grammar
from .ignored import log_ignored
from .responses_shapes import CUSTOM_INPUT, LOCAL_SHELL, flat_name
from .validate import get_bool, get_list, get_str

LOCAL_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"},
                    "description": "The command and its arguments, as for execvp."},
        "workdir": {"type": "string", "description": "The working directory."},
        "timeout_ms": {"type": "integer", "description": "Time limit in milliseconds."},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["command"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class CallTarget:
    """What a template tool name stands for on the client's side."""

    kind: str  # "function" | "custom" | "local_shell"
    name: str
    namespace: str | None = None


@dataclass(frozen=True)
class ResponsesTools:
    template: list[dict[str, Any]] | None  # shown to the template, after tool_choice
    targets: dict[str, CallTarget] = field(default_factory=dict)  # template name -> target
    grammar: str | None = None  # the answer's grammar (a forced call, constrained tools, format)
    param: str = "text.format"  # the field that asked for the grammar (error messages)


def _function(tool: dict[str, Any], path: str, namespace: str | None) -> dict[str, Any]:
    name = get_str(tool, "name", f"{path}.name")
    if not name:
        raise invalid_value(f"{path}.name", "A function tool needs a name.")
    get_bool(tool, "strict", f"{path}.strict")
    function = {"name": flat_name(name, namespace)}
    for key in ("description", "parameters"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _custom(tool: dict[str, Any], path: str) -> dict[str, Any]:
    name = get_str(tool, "name", f"{path}.name")
    if not name:
        raise invalid_value(f"{path}.name", "A custom tool needs a name.")
    description = get_str(tool, "description", f"{path}.description") or ""
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        description += (f"\n\nThe input must follow this {fmt.get('syntax', '')} grammar:\n"
                        f"{fmt.get('definition', '')}")
    parameters = {"type": "object", "additionalProperties": False, "required": [CUSTOM_INPUT],
                  "properties": {CUSTOM_INPUT: {"type": "string",
                                                "description": "The tool's raw input."}}}
    return {"type": "function", "function": {"name": name, "description": description.strip(),
                                             "parameters": parameters}}


def _local_shell() -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": LOCAL_SHELL, "description": "Run a command on the user's machine.",
        "parameters": LOCAL_SHELL_PARAMETERS}}


class _Collector:
    def __init__(self) -> None:
        self.tools: list[dict[str, Any]] = []
        self.targets: dict[str, CallTarget] = {}
        self.strict: set[str] = set()
        self.grammars: dict[str, str] = {}  # custom tools' input grammars by template name
        self.hosted: list[str] = []

    def add(self, tool: Any, path: str, namespace: str | None = None) -> None:
        if not isinstance(tool, dict):
            raise invalid_value(path, f"'{path}' must be an object.")
        kind = tool.get("type")
        if not isinstance(kind, str):
            raise invalid_value(f"{path}.type", f"'{path}.type' must be a string.")
        if kind == "namespace" and namespace is None:
            name = get_str(tool, "name", f"{path}.name")
            members = get_list(tool, "tools", f"{path}.tools")
            if not name or not members:
                raise invalid_value(path, "A namespace needs a name and tools.")
            for j, member in enumerate(members):
                self.add(member, f"{path}.tools[{j}]", name)
            return
        if kind == "function":
            entry = _function(tool, path, namespace)
            target = CallTarget("function", tool["name"], namespace)
            if tool.get("strict") is True:
                self.strict.add(entry["function"]["name"])
        elif kind == "custom" and namespace is None:
            entry, target = _custom(tool, path), CallTarget("custom", tool["name"])
            grammar = input_grammar(tool.get("format"), f"{path}.format")
            if grammar is not None:
                self.grammars[entry["function"]["name"]] = grammar
        elif kind == LOCAL_SHELL and namespace is None:
            entry, target = _local_shell(), CallTarget(LOCAL_SHELL, LOCAL_SHELL)
        else:
            self.hosted.append(kind)  # hosted tools run on OpenAI's side; nothing to show
            return
        self.tools.append(entry)
        self.targets[entry["function"]["name"]] = target


def _choice_names(choice: dict[str, Any], param: str) -> frozenset[str]:
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = get_str(choice, "name", f"{param}.name")
        if not name:
            raise invalid_value(f"{param}.name", f"'{param}.name' is required.")
        return frozenset({flat_name(name, get_str(choice, "namespace", f"{param}.namespace"))})
    if kind == LOCAL_SHELL:
        return frozenset({LOCAL_SHELL})
    raise unsupported(param, f"tool_choice {kind!r} names a tool this server cannot run.")


def parse_tools(value: Any, choice: Any, parallel: bool, answer: str | None = None
                ) -> ResponsesTools:
    """`tools` and `tool_choice`; a forced choice gets its grammar, and so do constrained tools
    under `auto` (`answer`: the grammar of `text.format`, None for text)."""
    if value is not None and not isinstance(value, list):
        raise invalid_value("tools", "'tools' must be an array.")
    collected = _Collector()
    for i, tool in enumerate(value or []):
        collected.add(tool, f"tools[{i}]")
    log_ignored("hosted tool", collected.hosted)
    tools, forced = collected.tools, None
    if choice == "none":
        return ResponsesTools(None, collected.targets, answer)
    if choice == "required":
        forced = ForcedCall()
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise invalid_value("tool_choice.mode", "allowed_tools mode must be 'auto' or "
                                "'required'.")
        allowed = get_list(choice, "tools", "tool_choice.tools") or []
        names = {flat_name(t.get("name", ""), t.get("namespace")) if t.get("type") != LOCAL_SHELL
                 else LOCAL_SHELL for t in allowed if isinstance(t, dict)}
        tools = [t for t in tools if t["function"]["name"] in names]
        forced = ForcedCall() if mode == "required" else None
    elif isinstance(choice, dict):
        forced = ForcedCall(_choice_names(choice, "tool_choice"), once=True)
    elif choice not in (None, "auto"):
        raise invalid_value("tool_choice", "'tool_choice' must be 'auto', 'none', 'required', "
                            "a tool or allowed_tools.")
    strict = frozenset(collected.strict)
    if forced is not None:
        if answer is not None:
            raise invalid_value("text.format", "text.format cannot constrain an answer that "
                                "tool_choice forces to be a tool call.")
        return ResponsesTools(tools or None, collected.targets, call_grammar(
            forced, tools, parallel, strict, "tool_choice", collected.grammars), "tool_choice")
    grammar = auto_grammar(tools, parallel, strict, collected.grammars, answer)
    if grammar is not None:
        return ResponsesTools(tools or None, collected.targets, grammar, "tools")
    return ResponsesTools(tools or None, collected.targets, answer)
