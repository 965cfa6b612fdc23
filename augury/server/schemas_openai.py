"""OpenAI request schemas (chat and legacy completions).

Unknown fields are ignored (clients send many); known fields are checked
here so a bad value becomes a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ContentPart(Lenient):
    type: str
    text: str | None = None


class ToolCallFunction(Lenient):
    name: str
    arguments: str = "{}"


class ToolCall(Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(Lenient):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaSpec(Lenient):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StreamOptions(Lenient):
    include_usage: bool = False


class SpeculativeSpec(Lenient):
    method: Literal["off", "ngram", "draft-model", "layerskip"] = "ngram"
    num_draft_tokens: int | None = Field(default=None, ge=0, le=16)


class KVCacheSpec(Lenient):
    codec: str | None = None
    key_bits: int | None = Field(default=None, ge=2, le=8)
    value_bits: int | None = Field(default=None, ge=2, le=8)
    group_size: int | None = Field(default=None, ge=8)
    start: int | None = Field(default=None, ge=0)


class AuguryExtensions(Lenient):
    """augury's own request fields (all APIs): speculation and the KV-cache policy."""

    speculative: bool | SpeculativeSpec | None = None
    kv_cache: KVCacheSpec | None = None

    def speculative_param(self) -> dict | bool | None:
        s = self.speculative
        if s is None or isinstance(s, bool):
            return None if s is True else s
        d = {"method": s.method}
        if s.num_draft_tokens is not None:
            d["num_draft_tokens"] = s.num_draft_tokens
        return d

    def kv_cache_param(self) -> dict | None:
        return None if self.kv_cache is None else self.kv_cache.model_dump(exclude_none=True)


class SamplingFields(AuguryExtensions):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool = True


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
