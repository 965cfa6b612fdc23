"""Build the drafters an engine offers from its config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from augury.config import EngineConfig
from augury.spec.base import DraftSource
from augury.spec.ngram import NgramDrafter

if TYPE_CHECKING:
    from augury.engine.engine import Engine


def build_drafters(engine: "Engine", config: EngineConfig) -> dict[str, DraftSource]:
    """ngram is free, so it is always offered; model drafters only when configured."""
    out: dict[str, DraftSource] = {"ngram": NgramDrafter(config.ngram_min, config.ngram_max)}
    if config.draft_model:
        from augury.spec.draft_model import ModelDrafter

        out["draft-model"] = ModelDrafter.from_path(engine, config.draft_model)
    if config.spec == "layerskip" or config.spec_layers:
        from augury.spec.layerskip import layerskip_drafter

        out["layerskip"] = layerskip_drafter(engine, config.spec_layers)
    return out
