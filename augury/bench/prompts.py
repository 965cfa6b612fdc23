"""Prompts the scenarios feed every engine: the same token ids go to augury and to its peers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

TASK_SETS = {"grounded": "spec_grounded.jsonl", "chat": "spec_chat.jsonl"}


def _data_text(name: str) -> str:
    return resources.files("augury.bench").joinpath("data", name).read_text(encoding="utf-8")


def filler_ids(tokenizer: Any, n: int, offset: int = 0) -> list[int]:
    """Exactly n token ids of ordinary text (the filler tiled), starting `offset` tokens in,
    with BOS first when the model's tokenizer adds one."""
    base = tokenizer.encode(_data_text("filler.txt"), add_special_tokens=False)
    bos = tokenizer.encode("", add_special_tokens=True)  # [] or [bos]
    need = n - len(bos)
    if need < 1:
        raise ValueError(f"prompt of {n} tokens is too short")
    reps = (offset + need) // len(base) + 2
    tiled = base * reps
    return bos + tiled[offset:offset + need]


def batch_prompts(tokenizer: Any, batch: int, n: int) -> list[list[int]]:
    """`batch` different prompts of exactly n tokens each (equal length: no padding for the peers)."""
    return [filler_ids(tokenizer, n, offset=17 * i) for i in range(batch)]


@dataclass(frozen=True)
class Task:
    id: str
    messages: list[dict[str, str]]


def load_task_set(name: str) -> list[Task]:
    if name not in TASK_SETS:
        raise ValueError(f"unknown task set {name!r}; choose {', '.join(TASK_SETS)}")
    rows = [json.loads(line) for line in _data_text(TASK_SETS[name]).splitlines() if line.strip()]
    return [Task(r["id"], r["messages"]) for r in rows]
