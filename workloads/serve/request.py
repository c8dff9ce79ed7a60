"""The OpenAI chat-completions request the gateway accepts: validated before anything reaches an engine."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError


class ChatMessage(BaseModel):
    """One turn. Other OpenAI message fields (name, tool_calls, tool_call_id) pass through unchanged."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The text of the turn: the string, or the `text` of each content part."""
        if isinstance(self.content, list):
            return "".join(str(part.get("text", "")) for part in self.content)
        return self.content or ""


class ChatRequest(BaseModel):
    """The fields the engines understand; any other field is dropped, never forwarded (an engine-specific
    field such as `generation_config` could lift the configured limits)."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    stream: StrictBool = False
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    user: StrictStr | None = None

    @property
    def asked_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class RequestError(ValueError):
    """A request body the gateway refuses; the message names each wrong field."""


def parse_chat_request(document: Any) -> ChatRequest:
    if not isinstance(document, dict):
        raise RequestError(f"request body must be a JSON object, got {type(document).__name__}")
    try:
        return ChatRequest.model_validate(document)
    except ValidationError as error:
        problems = [f"{'.'.join(str(part) for part in e['loc']) or 'body'}: {e['msg']}" for e in error.errors()]
        raise RequestError("; ".join(problems)) from None
