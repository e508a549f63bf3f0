"""Request bodies as Codex CLI sends them to `POST /v1/responses` (its `ResponsesApiRequest`).

Written from Codex's public source (codex-rs: the request struct, the tool specs of `shell`,
`update_plan`, `view_image`, the freeform `apply_patch` with a Lark grammar, `local_shell`,
`web_search`, and the history item shapes), with the long base instructions cut to a paragraph
so the prompt fits the default model's 8K context. Field names, nesting and values are Codex's.
"""
from __future__ import annotations

import copy
from typing import Any

INSTRUCTIONS = (
    "You are a coding agent running in the Codex CLI, a terminal-based coding assistant. "
    "You are expected to be precise, safe, and helpful. Use the shell tool to read files and "
    "run commands; edit files with apply_patch; keep the plan up to date with update_plan. "
    "Keep answers short and say what you changed.")

# A grammar in the style of Codex's apply_patch format (our own wording of it).
PATCH_GRAMMAR = r"""
start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change+
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
change: (context_line | del_line | add_line)+
context_line: " " /(.*)/ LF -> line
del_line: "-" /(.*)/ LF -> line
%import common.LF
"""

SHELL = {
    "type": "function", "name": "shell", "strict": False,
    "description": "Runs a shell command and returns its output.",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"},
                        "description": "The command to execute"},
            "workdir": {"type": "string", "description": "The working directory"},
            "timeout_ms": {"type": "number", "description": "The timeout in milliseconds"},
            "with_escalated_permissions": {"type": "boolean"},
            "justification": {"type": "string"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}
UPDATE_PLAN = {
    "type": "function", "name": "update_plan", "strict": False,
    "description": "Updates the task plan.",
    "parameters": {
        "type": "object",
        "properties": {
            "explanation": {"type": "string"},
            "plan": {"type": "array", "items": {
                "type": "object",
                "properties": {"step": {"type": "string"},
                               "status": {"type": "string",
                                          "enum": ["pending", "in_progress", "completed"]}},
                "required": ["step", "status"], "additionalProperties": False}},
        },
        "required": ["plan"],
        "additionalProperties": False,
    },
}
VIEW_IMAGE = {
    "type": "function", "name": "view_image", "strict": False,
    "description": "Attach a local image (by filesystem path) to the conversation context.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"], "additionalProperties": False},
}
APPLY_PATCH = {
    "type": "custom", "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool, so do "
                   "not wrap the patch in JSON.",
    "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR},
}
ENVIRONMENT = ("<environment_context>\n  <cwd>/home/user/project</cwd>\n  <approval_policy>"
               "on-request</approval_policy>\n  <sandbox_mode>workspace-write</sandbox_mode>\n"
               "  <network_access>restricted</network_access>\n  <shell>bash</shell>\n"
               "</environment_context>")
PERMISSIONS = ("<permissions instructions>Filesystem sandboxing: workspace-write. Approval "
               "policy: on-request.</permissions instructions>")


def _message(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def default_body(model: str, prompt: str = "Say hello in one short sentence.") -> dict[str, Any]:
    """Codex's default first-turn body (API-key provider, no reasoning model features)."""
    return {
        "model": model,
        "instructions": INSTRUCTIONS,
        "input": [_message("developer", PERMISSIONS), _message("user", ENVIRONMENT),
                  _message("user", prompt)],
        "tools": [SHELL, UPDATE_PLAN, APPLY_PATCH, VIEW_IMAGE],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": None,
        "store": False,
        "stream": True,
        "include": [],
        "prompt_cache_key": "019a1c7e-5b7d-7c32-9f51-3c4a1d2e8f90",
    }


def every_field_body(model: str, sealed_reasoning: str | None = None) -> dict[str, Any]:
    """A later turn with every field and item kind of the issue: reasoning replay, custom and
    local-shell history, hosted tools, service tier, verbosity and client metadata."""
    body = default_body(model, "Thanks. Now summarize what you did in one sentence.")
    body.update({
        "tools": [SHELL, UPDATE_PLAN, APPLY_PATCH, VIEW_IMAGE, {"type": "local_shell"},
                  {"type": "web_search", "external_web_access": False}],
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "service_tier": "priority",
        "text": {"verbosity": "low"},
        "client_metadata": {"x-codex-installation-id": "6f1c2d3e-0000-4000-8000-000000000001"},
    })
    history = [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text",
                                                         "text": "Looking at the repo."}],
         "content": None, "encrypted_content": sealed_reasoning or "gAAAAABo-not-ours"},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_ls", "status": "completed",
         "action": {"type": "exec", "command": ["ls", "-la"], "timeout_ms": 10000,
                    "working_directory": "/home/user/project", "env": {}, "user": None}},
        {"type": "function_call_output", "call_id": "call_ls", "output": "README.md\nsrc\n"},
        {"type": "function_call", "id": "fc_1", "name": "shell", "call_id": "call_cat",
         "arguments": "{\"command\":[\"cat\",\"README.md\"]}"},
        {"type": "function_call_output", "call_id": "call_cat", "output": "# project\n"},
        {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "call_p",
         "name": "apply_patch",
         "input": "*** Begin Patch\n*** Add File: NOTES.md\n+hello\n*** End Patch\n"},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "lark grammar"}},
        _message("assistant", "I added NOTES.md."),
    ]
    body["input"] = body["input"][:2] + history + [copy.deepcopy(body["input"][2])]
    return body
