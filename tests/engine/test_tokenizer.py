from __future__ import annotations

import json

import pytest

from ninfer_engine.chat import ChatTemplate, ChatTemplateError
from ninfer_engine.tokenizer import IncrementalDetokenizer, Tokenizer

from .helpers import CHAT_TEMPLATE, byte_tokenizer_json


def _tokenizer(**tok_cfg) -> Tokenizer:
    config = {"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>", **tok_cfg}
    return Tokenizer.from_json(byte_tokenizer_json().encode(), config, {"eos_token_id": [258, 257]})


def test_encode_decode_roundtrip_without_bos():
    tok = _tokenizer()
    text = "héllo wörld €"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode())  # one token per byte
    assert tok.decode(ids) == text
    assert tok.eos_token_ids == (258, 257)


def test_bos_only_when_configured():
    assert _tokenizer(add_bos_token=True).encode("a")[0] == 258
    assert _tokenizer().encode("a") == [ord("a")]


def test_special_tokens_encode_as_one_id():
    tok = _tokenizer()
    assert tok.encode("<|im_start|>user") == [256, *b"user"]


def test_detokenizer_holds_split_multibyte_characters():
    tok = _tokenizer()
    text = "a€b😀c"
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add([i]) for i in tok.encode(text)]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.finish() == text
    # the 3-byte € arrives as three ids: nothing is emitted until the last one
    assert deltas[1:4] == ["", "", "€"]


def test_detokenizer_replaces_impossible_bytes():
    tok = _tokenizer()
    detok = IncrementalDetokenizer(tok)
    out = detok.add([0xFF]) + detok.add([ord("a")])
    assert out == "\ufffda"
    detok = IncrementalDetokenizer(tok)
    assert detok.add([0xE2, 0x82]) == ""  # the start of a 3-byte character
    assert detok.finish() == "\ufffd"


def test_detokenizer_skips_special_tokens_and_uses_prompt_context():
    tok = _tokenizer()
    detok = IncrementalDetokenizer(tok, tok.encode("<|im_start|>assistant\n"))
    assert detok.add(tok.encode(" hi")) == " hi"
    assert detok.add([257]) == ""


def test_chat_template_renders_like_transformers_helpers():
    template = ChatTemplate(CHAT_TEMPLATE, "<s>", "</s>")
    out = template.render([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert template.render([{"role": "user", "content": "hi"}], add_generation_prompt=False) \
        == "<|im_start|>user\nhi<|im_end|>\n"


def test_chat_template_helpers():
    source = ("{{ bos_token }}{{ tools | tojson }}{% if not messages %}"
              "{{ raise_exception('no messages') }}{% endif %}{{ strftime_now('%Y') | length }}")
    template = ChatTemplate(source, "<s>")
    tools = [{"name": "f", "description": "é<>"}]
    assert template.render([{"role": "user", "content": "x"}], tools=tools) == \
        "<s>" + json.dumps(tools, ensure_ascii=False) + "4"
    try:
        template.render([])
    except ValueError as exc:
        assert "no messages" in str(exc)
    else:
        raise AssertionError("raise_exception did not raise")


def test_chat_template_is_sandboxed():
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% set x = messages.append(1) %}").render([])


def test_added_tokens_decoder_extends_the_vocabulary():
    config = {"added_tokens_decoder": {"259": {"content": "<think>"}}}
    tok = Tokenizer.from_json(byte_tokenizer_json().encode(), config)
    assert tok.encode("<think>a") == [259, ord("a")]
    with pytest.raises(ValueError, match="cannot take id"):
        Tokenizer.from_json(byte_tokenizer_json().encode(),
                            {"added_tokens_decoder": {"300": {"content": "<x>"}}})


@pytest.mark.parametrize("bos", [False, True])
def test_encode_many_is_encode_of_each_text(bos):
    tok = _tokenizer(add_bos_token=bos)
    texts = ["héllo wörld €", "", "<|im_start|>user\nhi", "x" * 5000]
    assert tok.encode_many(texts) == [tok.encode(text) for text in texts]
