"""Request bodies as Claude Code sends them to `POST /v1/messages?beta=true`.

Written from Claude Code's public behaviour (requests captured by proxies and published): a
`system` array whose first block is the per-request `x-anthropic-billing-header:` line, then
"You are Claude Code, ..." and the long instructions, both with `cache_control`; tools with a
draft-07 `input_schema` (`$schema`, `additionalProperties: false`); the user turn's
`<system-reminder>` context block before the prompt, the last block marked for caching;
`metadata.user_id`; `max_tokens` 32000 with `thinking` `enabled` at budget 31999;
`temperature` 1 and `stream`. The instructions are cut to a paragraph and the tools to six so
the prompt fits the default 8K context (the real prompt and tools are ~15.7K tokens: serve
them with `--max-context 32768`). Each tool has a Pydantic model mirroring its schema, which
the tests validate the calls' `input` with.
"""
from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14",
         "fine-grained-tool-streaming-2025-05-14"]
HEADERS = {"x-app": "cli", "user-agent": "claude-cli/2.0.14 (external, cli)",
           "anthropic-dangerous-direct-browser-access": "true"}

BILLING = "x-anthropic-billing-header: cc_version=2.0.14.a1b; cc_entrypoint=cli"
IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."
INSTRUCTIONS = (
    "\nYou are an interactive CLI tool that helps users with software engineering tasks. Use "
    "the instructions below and the tools available to you to assist the user.\n\n"
    "# Tone and style\nBe concise, direct, and to the point. Answer in fewer than 4 lines "
    "unless asked for detail.\n\n# Tool usage policy\nUse Read before Edit. Use Glob and Grep "
    "to search. Track multi-step work with TodoWrite.\n\n<env>\nWorking directory: "
    "/home/user/project\nIs directory a git repo: Yes\nPlatform: linux\nToday's date: "
    "2025-10-12\n</env>")
REMINDER = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following "
    "context:\n# claudeMd\nCodebase and user instructions are shown below.\n\nContents of "
    "/home/user/project/CLAUDE.md:\n\nRun tests with `make test`.\n\n      IMPORTANT: this "
    "context may or may not be relevant to your tasks.\n</system-reminder>\n")
DRAFT_07 = "http://json-schema.org/draft-07/schema#"


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False, "$schema": DRAFT_07}


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


TOOLS = [
    {"name": "Bash", "description": "Executes a given bash command in a persistent shell.",
     "input_schema": _schema({
         "command": _string("The command to execute"),
         "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
         "description": _string("Clear, concise description of what this command does"),
         "run_in_background": {"type": "boolean"}}, ["command"])},
    {"name": "Glob", "description": "Fast file pattern matching tool.",
     "input_schema": _schema({"pattern": _string("The glob pattern to match files against"),
                              "path": _string("The directory to search in")}, ["pattern"])},
    {"name": "Grep", "description": "A powerful search tool built on ripgrep.",
     "input_schema": _schema({
         "pattern": _string("The regular expression pattern to search for"),
         "path": _string("File or directory to search in"),
         "output_mode": {"type": "string",
                         "enum": ["content", "files_with_matches", "count"]},
         "-i": {"type": "boolean", "description": "Case insensitive search"}}, ["pattern"])},
    {"name": "Read", "description": "Reads a file from the local filesystem.",
     "input_schema": _schema({
         "file_path": _string("The absolute path to the file to read"),
         "offset": {"type": "number"}, "limit": {"type": "number"}}, ["file_path"])},
    {"name": "Edit", "description": "Performs exact string replacements in files.",
     "input_schema": _schema({
         "file_path": _string("The absolute path to the file to modify"),
         "old_string": _string("The text to replace"),
         "new_string": _string("The text to replace it with"),
         "replace_all": {"type": "boolean", "default": False}},
         ["file_path", "old_string", "new_string"])},
    {"name": "TodoWrite", "description": "Create and manage a structured task list.",
     "input_schema": _schema({"todos": {"type": "array", "items": {
         "type": "object",
         "properties": {"content": {"type": "string", "minLength": 1},
                        "status": {"type": "string",
                                   "enum": ["pending", "in_progress", "completed"]},
                        "activeForm": {"type": "string", "minLength": 1}},
         "required": ["content", "status", "activeForm"], "additionalProperties": False}}},
         ["todos"]),
     "cache_control": {"type": "ephemeral"}},
]


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Bash(_Input):
    command: str
    timeout: float | None = None
    description: str | None = None
    run_in_background: bool | None = None


class Glob(_Input):
    pattern: str
    path: str | None = None


class Grep(_Input):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    pattern: str
    path: str | None = None
    output_mode: Literal["content", "files_with_matches", "count"] | None = None
    ignore_case: bool | None = Field(None, alias="-i")


class Read(_Input):
    file_path: str
    offset: float | None = None
    limit: float | None = None


class Edit(_Input):
    file_path: str
    old_string: str
    new_string: str
    replace_all: bool | None = None


class Todo(_Input):
    content: str = Field(min_length=1)
    status: Literal["pending", "in_progress", "completed"]
    activeForm: str = Field(min_length=1)


class TodoWrite(_Input):
    todos: list[Todo]


INPUTS: dict[str, type[BaseModel]] = {
    "Bash": Bash, "Glob": Glob, "Grep": Grep, "Read": Read, "Edit": Edit,
    "TodoWrite": TodoWrite}


def first_turn(model: str, prompt: str = "Say hello in one short sentence.") -> dict[str, Any]:
    """Claude Code's first request of a session (thinking on), without the beta list."""
    return {
        "model": model,
        "max_tokens": 32000,
        "system": [{"type": "text", "text": BILLING},
                   {"type": "text", "text": IDENTITY, "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": INSTRUCTIONS,
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": REMINDER},
            {"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}}]}],
        "tools": copy.deepcopy(TOOLS),
        "metadata": {"user_id": "user_3f2a9c0d5e7b4a1c8f6e2d9b0a7c5e3f1d8b6a4c2e0f9d7b5a3c1e8f"
                                "6d4b2a0c_account__session_7c1e5b3a-9d2f-4e8a-b6c0-1f3d5a7e9b2c"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "temperature": 1,
        "stream": True,
    }


def forced_turn(model: str, tool_choice: dict[str, Any], prompt: str) -> dict[str, Any]:
    """The same body with a forced `tool_choice`: thinking off (the Anthropic API refuses
    thinking with a forced tool), greedy, and a small output limit."""
    body = first_turn(model, prompt)
    del body["thinking"]
    body.update(tool_choice=tool_choice, temperature=0, max_tokens=256)
    return body
