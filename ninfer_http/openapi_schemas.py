"""Component schemas of the OpenAPI document (`openapi.py`), one group per protocol.

Request schemas describe what this server accepts (contract §5–§7) closely enough that generated
examples reach the engine; response schemas give the top-level shape only.
"""
from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def obj(properties: dict[str, Schema], *required: str, **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    return schema


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _number(low: float, high: float) -> Schema:
    return {"type": "number", "minimum": low, "maximum": high}


def _text_or_parts(text_type: str, *other_parts: Schema) -> Schema:
    """A string, or a non-empty array of `{type: text_type, text}` and the other parts."""
    text = obj({"type": {"const": text_type}, "text": {"type": "string"}}, "type", "text")
    parts = {"type": "array", "minItems": 1, "items": {"anyOf": [text, *other_parts]}}
    return {"anyOf": [{"type": "string"}, parts]}


STRING = {"type": "string"}
BOOLEAN = {"type": "boolean"}
OBJECT = {"type": "object"}
ARRAY = {"type": "array"}
TOOL_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}
EFFORT = {"enum": ["none", "minimal", "low", "medium", "high", "max", "xhigh", "adaptive"]}
MEDIA_URL = {"type": "string", "pattern": "^(https?://|data:)"}
RESPONSE_FORMAT = {"type": "object", "properties": {
    "type": {"enum": ["text", "json_object", "json_schema"]},
    "json_schema": {"type": "object", "properties": {"name": {"type": "string"},
                                                     "schema": {"type": "object"},
                                                     "strict": {"type": "boolean"}}}},
    "required": ["type"]}


def _common() -> dict[str, Schema]:
    return {
        "OpenAIError": obj({"error": obj({
            "message": STRING, "type": STRING, "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "null"]},
        }, "message", "type", "param", "code")}, "error"),
        "AnthropicError": obj({"type": {"const": "error"},
                               "error": obj({"type": STRING, "message": STRING}, "type", "message"),
                               "request_id": STRING}, "type", "error"),
        "Model": obj({"id": STRING, "object": {"const": "model"}, "created": {"type": "integer"},
                      "owned_by": {"const": "ninfer"}, "max_model_len": {"type": "integer"}},
                     "id", "object", "created", "owned_by", "max_model_len"),
        "InputTokens": obj({"input_tokens": {"type": "integer"}}, "input_tokens"),
        "EngineState": obj({"state": STRING, "failure": {"type": ["string", "null"]},
                            "profile": {"type": ["string", "null"]}, "model_id": STRING,
                            "uptime_s": {"type": "number"}, "memory": OBJECT, "kv": OBJECT,
                            "experts": {"type": ["object", "null"]},
                            "spec": {"type": ["object", "null"]},
                            "vision": {"type": ["object", "null"]}, "queue": OBJECT,
                            "throughput": OBJECT}, "state", "kv", "queue"),
    }


def _chat(model: Schema) -> dict[str, Schema]:
    function = obj({"name": TOOL_NAME, "description": STRING, "parameters": OBJECT,
                    "strict": BOOLEAN}, "name")
    call = obj({"id": STRING, "type": {"const": "function"},
                "function": obj({"name": TOOL_NAME, "arguments": STRING}, "name")},
               "id", "type", "function")
    image = obj({"type": {"const": "image_url"},
                 "image_url": obj({"url": MEDIA_URL, "detail": {"enum": ["auto"]}}, "url")},
                "type", "image_url")
    video = obj({"type": {"const": "video_url"},  # ours (contract §5)
                 "video_url": obj({"url": MEDIA_URL}, "url")}, "type", "video_url")
    message = obj({"role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                   "content": _text_or_parts("text", image, video), "reasoning_content": STRING,
                   "tool_calls": {"type": "array", "items": call}, "tool_call_id": STRING},
                  "role", "content")
    allowed = obj({"type": {"const": "allowed_tools"},
                   "allowed_tools": obj({"mode": {"enum": ["auto", "required"]}, "tools": ARRAY},
                                        "mode", "tools")}, "type", "allowed_tools")
    named = obj({"type": {"const": "function"}, "function": obj({"name": TOOL_NAME}, "name")},
                "type", "function")
    return {
        "ChatCompletionRequest": obj({
            "model": model, "messages": {"type": "array", "items": message, "minItems": 1},
            "stream": BOOLEAN, "stream_options": obj({"include_usage": BOOLEAN}),
            "max_tokens": {"type": "integer", "minimum": 0},
            "max_completion_tokens": {"type": "integer", "minimum": 0},
            "stop": {"anyOf": [STRING, {"type": "array", "items": STRING, "maxItems": 4}]},
            "reasoning_effort": EFFORT, "chat_template_kwargs": OBJECT,
            "enable_thinking": BOOLEAN, "preserve_thinking": BOOLEAN,
            "tools": {"type": "array", "items": obj({"type": {"const": "function"},
                                                     "function": function}, "type", "function")},
            "tool_choice": {"anyOf": [{"enum": ["auto", "none", "required"]}, named, allowed]},
            "parallel_tool_calls": BOOLEAN, "n": {"type": "integer", "minimum": 1, "maximum": 8},
            # json_object / json_schema constrain the answer through llguidance
            "response_format": RESPONSE_FORMAT, "logprobs": BOOLEAN,
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            "prompt_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
            "ignore_eos": BOOLEAN,  # vLLM's, for benchmarks: answers run to max_tokens
            "temperature": _number(0, 2), "top_p": _number(0, 1),
            "top_k": {"type": "integer", "minimum": 0, "maximum": 20}, "min_p": _number(0, 1),
            "presence_penalty": _number(-2, 2), "frequency_penalty": _number(-2, 2),
            "seed": {"type": "integer"},
        }, "model", "messages"),
        "ChatCompletion": obj({"id": STRING, "object": {"const": "chat.completion"},
                               "created": {"type": "integer"}, "model": STRING,
                               "choices": ARRAY, "usage": OBJECT},
                              "id", "object", "created", "model", "choices"),
    }


def _responses(model: Schema) -> dict[str, Schema]:
    function = obj({"type": {"const": "function"}, "name": TOOL_NAME, "parameters": OBJECT,
                    "strict": BOOLEAN}, "type", "name")
    # a `grammar` format (Lark or a regex) holds the tool's input to it
    custom_format = obj({"type": {"enum": ["text", "grammar"]},
                         "syntax": {"enum": ["lark", "regex"]}, "definition": STRING}, "type")
    custom = obj({"type": {"const": "custom"}, "name": TOOL_NAME, "description": STRING,
                  "format": custom_format}, "type", "name")
    # hosted tools (web_search, file_search, ...) are accepted and left out of the prompt
    other_tool = obj({"type": STRING}, "type")
    namespace = obj({"type": {"const": "namespace"}, "name": STRING,
                     "tools": {"type": "array", "minItems": 1, "items": function}},
                    "type", "name", "tools")
    image = obj({"type": {"const": "input_image"}, "image_url": MEDIA_URL,
                 "detail": {"enum": ["auto"]}}, "type", "image_url")
    video = obj({"type": {"const": "input_video"}, "video_url": MEDIA_URL},  # ours
                "type", "video_url")
    item = obj({
        "type": {"enum": ["message", "reasoning", "function_call", "function_call_output",
                          "custom_tool_call", "custom_tool_call_output", "local_shell_call",
                          "web_search_call"]},
        "role": {"enum": ["user", "assistant", "system", "developer"]},
        "content": _text_or_parts("input_text", image, video), "call_id": STRING,
        "name": STRING,
        "arguments": STRING, "output": STRING, "input": STRING, "encrypted_content": STRING})
    allowed = obj({"type": {"const": "allowed_tools"}, "mode": {"enum": ["auto", "required"]},
                   "tools": ARRAY}, "type", "tools")
    named = obj({"type": {"enum": ["function", "custom"]}, "name": TOOL_NAME}, "type", "name")
    text_format = obj({"type": {"enum": ["text", "json_object", "json_schema"]}, "name": STRING,
                       "schema": OBJECT, "strict": BOOLEAN}, "type")
    fields = {
        "model": model, "input": {"anyOf": [STRING, {"type": "array", "items": item}]},
        "instructions": STRING, "previous_response_id": STRING,
        "max_output_tokens": {"type": ["integer", "null"], "minimum": 0},
        "stream": BOOLEAN, "store": BOOLEAN, "temperature": _number(0, 2), "top_p": _number(0, 1),
        "metadata": {"type": "object", "maxProperties": 16, "additionalProperties": STRING},
        "reasoning": obj({"effort": EFFORT}), "chat_template_kwargs": OBJECT,
        "preserve_thinking": BOOLEAN,
        "tools": {"type": "array", "items": {"anyOf": [function, namespace, custom, other_tool]}},
        "tool_choice": {"anyOf": [{"enum": ["auto", "none", "required"]}, named, allowed]},
        "text": obj({"format": text_format, "verbosity": {"enum": ["low", "medium", "high"]}}),
        "truncation": {"const": "disabled"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "service_tier": STRING, "background": {"const": False},
        # reasoning.encrypted_content is honoured; other values are accepted and ignored
        "include": {"type": "array", "items": STRING},
        "parallel_tool_calls": BOOLEAN, "prompt_cache_key": STRING,
        "client_metadata": {"type": "object", "additionalProperties": STRING},
    }
    return {
        # Unknown keys are accepted and ignored (logged once each).
        "ResponseCreateRequest": obj(fields, "model", "input"),
        "ResponseInputTokensRequest": obj(fields, "input"),
        "Response": obj({"id": STRING, "object": {"const": "response"},
                         "status": {"enum": ["completed", "incomplete", "failed"]},
                         "output": ARRAY, "usage": {"type": ["object", "null"]}},
                        "id", "object", "status", "output"),
    }


def _completions(model: Schema) -> dict[str, Schema]:
    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
    return {
        "CompletionRequest": obj({
            "model": model, "prompt": {"anyOf": [{"type": "string", "minLength": 1}, ids,
                                                 {"type": "array", "maxItems": 1,
                                                  "items": {"anyOf": [STRING, ids]}}]},
            "max_tokens": {"type": "integer", "minimum": 0}, "stream": BOOLEAN,
            "stream_options": obj({"include_usage": BOOLEAN}), "echo": BOOLEAN,
            "n": {"type": "integer", "minimum": 1, "maximum": 8},
            "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
            "prompt_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
            "stop": {"anyOf": [STRING, {"type": "array", "items": STRING, "maxItems": 4}]},
            "temperature": _number(0, 2), "top_p": _number(0, 1),
            "top_k": {"type": "integer", "minimum": 0, "maximum": 20}, "seed": {"type": "integer"},
            "presence_penalty": _number(-2, 2), "frequency_penalty": _number(-2, 2),
            "ignore_eos": BOOLEAN,
        }, "model", "prompt"),
        "Completion": obj({"id": STRING, "object": {"const": "text_completion"},
                           "created": {"type": "integer"}, "model": STRING, "choices": ARRAY,
                           "usage": OBJECT}, "id", "object", "created", "model", "choices"),
    }


def _anthropic() -> dict[str, Schema]:
    other_block = obj({"type": {"enum": ["thinking", "tool_use", "tool_result"]}}, "type")
    source = {"anyOf": [
        obj({"type": {"const": "base64"}, "media_type": STRING, "data": STRING},
            "type", "media_type", "data"),
        obj({"type": {"const": "url"}, "url": {"type": "string", "pattern": "^https?://"}},
            "type", "url")]}
    image = obj({"type": {"const": "image"}, "source": source}, "type", "source")
    message = obj({"role": {"enum": ["user", "assistant"]},
                   "content": _text_or_parts("text", image, other_block)}, "role", "content")
    # `strict`: a call's input matches input_schema (under `auto` too)
    tool = obj({"name": TOOL_NAME, "description": STRING, "input_schema": OBJECT,
                "strict": BOOLEAN}, "name", "input_schema")
    output_format = obj({"type": {"const": "json_schema"}, "schema": OBJECT}, "type", "schema")
    return {
        "MessagesRequest": obj({
            "model": STRING, "messages": {"type": "array", "minItems": 1, "items": message},
            "max_tokens": {"type": "integer", "minimum": 1}, "system": _text_or_parts("text"),
            "stream": BOOLEAN, "stop_sequences": {"type": "array", "items": STRING},
            "temperature": _number(0, 2), "top_p": _number(0, 1),
            "top_k": {"type": "integer", "minimum": 0}, "metadata": OBJECT,
            "thinking": obj({"type": {"enum": ["disabled", "adaptive", "enabled"]},
                             "budget_tokens": {"type": "integer", "minimum": 1024},
                             "display": {"const": "omitted"}}, "type"),
            # structured outputs: the answer's text follows the schema (grammar-enforced)
            "output_config": obj({"effort": EFFORT, "format": output_format}),
            "output_format": output_format,
            "tools": {"type": "array", "items": tool},
            # `any` / `tool` (with `name`) force a call through the tool-call grammar
            "tool_choice": obj({"type": {"enum": ["auto", "none", "any", "tool"]},
                                "name": TOOL_NAME, "disable_parallel_tool_use": BOOLEAN},
                               "type"),
        }, "model", "messages"),
        "Message": obj({"id": STRING, "type": {"const": "message"},
                        "role": {"const": "assistant"}, "content": ARRAY,
                        "stop_reason": {"type": ["string", "null"]}, "usage": OBJECT},
                       "id", "type", "role", "content"),
    }


def component_schemas(model_id: str) -> dict[str, Schema]:
    """Every named schema; `model_id` is the one `model` the OpenAI paths accept (else 404)."""
    model = {"const": model_id}
    return {**_common(), **_chat(model), **_responses(model), **_completions(model),
            **_anthropic()}
