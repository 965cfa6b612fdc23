"""Server settings (what `augury serve` passes besides the engine)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from augury.server.tool_calls import FORMATS


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None  # when set, every route but /health (and the chat page) needs it
    max_body_bytes: int = 8 * 1024 * 1024
    tool_parser: str = "auto"  # auto | hermes | llama3_json | pythonic
    default_max_tokens: int | None = None  # None: up to the rest of the context window
    retry_after_s: int = 1  # Retry-After on 429
    enable_web_chat: bool = True

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("port: must be in [0, 65535]")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes: must be >= 1024")
        if self.tool_parser not in FORMATS:
            raise ValueError(f"tool_parser: must be one of {FORMATS}")

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
