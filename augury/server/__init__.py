"""HTTP server: OpenAI- and Anthropic-compatible API over an augury Engine."""

from augury.server.app import create_app, run_server, serve
from augury.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app", "run_server", "serve"]
