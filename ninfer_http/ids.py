"""Random public ids (contract §2 "Ids and headers")."""
from __future__ import annotations

import secrets


def hex_id(prefix: str, hex_digits: int) -> str:
    """`prefix` followed by `hex_digits` random lowercase hex digits."""
    return prefix + secrets.token_hex(hex_digits // 2)


def openai_request_id() -> str:
    return hex_id("req_", 32)


def anthropic_request_id() -> str:
    return hex_id("req_", 16)


def chat_completion_id() -> str:
    return hex_id("chatcmpl-", 16)


def anthropic_message_id() -> str:
    return hex_id("msg_", 16)
