"""Render OpenAI-shaped messages with the artifact's Jinja chat template, as `transformers` does.

The environment mirrors `transformers.utils.chat_template_utils`: an immutable sandbox with
`trim_blocks`/`lstrip_blocks`, loop controls, a `{% generation %}` tag, and the `raise_exception`,
`strftime_now` and non-escaping `tojson` helpers, so Hub templates render byte for byte the same.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template is missing, does not compile, or raised while rendering."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` marks assistant spans for training; render as is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which would change the prompt
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token strings templates refer to."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None):
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    def __reduce__(self):  # compiled again from its source (`engine_process` sends it)
        return ChatTemplate, (self.source, self.bos_token, self.eos_token)

    @classmethod
    def from_artifact(cls, artifact: Any, override: Path | None = None,
                      bos_token: str | None = None, eos_token: str | None = None) -> ChatTemplate:
        """The `--chat-template` file if given, else the artifact's `chat_template.jinja`,
        else `tokenizer_config.json`'s `chat_template` string."""
        if override is not None:
            return cls(Path(override).read_text(encoding="utf-8"), bos_token, eos_token)
        if artifact.has_resource("chat_template.jinja"):
            source = artifact.resource("chat_template.jinja").decode("utf-8")
            return cls(source, bos_token, eos_token)
        source = None
        if artifact.has_resource("tokenizer_config.json"):
            source = json.loads(artifact.resource("tokenizer_config.json")).get("chat_template")
        if not isinstance(source, str):
            raise ChatTemplateError("the artifact has no chat template; pass --chat-template FILE")
        return cls(source, bos_token, eos_token)

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: object,
    ) -> str:
        """Render OpenAI-shaped messages (role/content/tool_calls) to the prompt text."""
        variables: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **template_kwargs,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**variables)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
