"""ninfer's HTTP layer: OpenAI Chat Completions (and later Responses, Anthropic Messages).

Depends on `ninfer_engine` only through `ServingEngine`; never imports textual.
"""
from .app import create_app
from .logs import configure_logging
from .server import RunningServer, start_server

__all__ = ["RunningServer", "configure_logging", "create_app", "start_server"]
