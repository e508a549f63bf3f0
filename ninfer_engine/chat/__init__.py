"""Chat prompt rendering, and the output parsers for `<think>` (reasoning.py) and tool calls
(tool_calls.py, typed by arguments.py)."""
from .template import ChatTemplate, ChatTemplateError

__all__ = ["ChatTemplate", "ChatTemplateError"]
