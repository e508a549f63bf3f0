"""Constrained decoding with llguidance: grammars from JSON schemas and tool definitions
(grammar.py), one request's grammar state (matcher.py) and the batched token masks the sampler
applies (mask.py)."""
from .grammar import (
    GrammarError,
    custom_input_grammar,
    json_object_grammar,
    json_schema_grammar,
    optional_call_grammar,
    tool_call_grammar,
)
from .matcher import ConstraintUnavailable, TokenConstraint, compile_constraint

__all__ = ["ConstraintUnavailable", "GrammarError", "TokenConstraint", "compile_constraint",
           "custom_input_grammar", "json_object_grammar", "json_schema_grammar",
           "optional_call_grammar", "tool_call_grammar"]
