"""The OpenAI chat-completions request the gateway accepts: validated before anything reaches an engine."""

from __future__ import annotations

from collections import deque
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, field_validator

from documents.text_input import TextInputError, is_unicode, load_json

JSON_MEDIA_TYPE = "application/json"
SEED_RANGE = (-(2**63), 2**63 - 1)
"""a 64-bit signed integer, as vLLM's request takes it (torch.long); beyond it torch's generators overflow."""


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


VLLM_FIELDS = frozenset({
    "top_k", "min_p", "repetition_penalty", "length_penalty", "min_tokens", "stop_token_ids", "logit_bias",
    "bad_words", "allowed_token_ids", "include_stop_str_in_output", "skip_special_tokens",
    "spaces_between_special_tokens", "structured_outputs", "prompt_logprobs", "parallel_tool_calls",
    "use_beam_search", "return_token_ids",
})
"""Fields of vLLM's ChatCompletionRequest beyond the ones declared below (vllm/entrypoints/openai/chat_completion/
protocol.py, v0.32.0) that steer decoding only: forwarded to a vLLM engine. Its other fields (chat_template,
chat_template_kwargs, add_generation_prompt, echo, request_id, priority, kv_transfer_params, vllm_xargs, ...) change
how the server renders or schedules a request, which is the server's to set: refused, naming the field."""

PEFT_UNSUPPORTED = ("stop", "logprobs", "top_logprobs", "response_format", "tools", "tool_choice",
                    "frequency_penalty", "presence_penalty")
"""OpenAI fields the peft engine (workloads.serve.engine.server) does not act on: refused there, never ignored."""


class ChatRequest(BaseModel):
    """The OpenAI fields the engines understand; any other field is kept aside (`model_extra`) and either
    forwarded (a vLLM engine's decoding fields) or refused naming it (`refused_field`), never silently dropped."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    stream: StrictBool = False
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: StrictInt | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: StrictStr | list[StrictStr] | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    user: StrictStr | None = None
    ignore_eos: StrictBool | None = None
    """vLLM's extension: generate max_tokens tokens whatever the model says (benchmarks: equal lengths)."""
    n: StrictInt | None = None
    """choices per request: only 1 is served (as one stream per request)."""

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError(f"{value} choices asked; this endpoint returns one choice per request (n must be 1)")
        return value

    @property
    def asked_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def refused_field(request: BaseModel, engine: str) -> str | None:
    """Why the request cannot go to `engine` as it is (the first field it cannot honour), None when it can."""
    for name in request.model_extra or {}:
        if engine == "vllm" and name in VLLM_FIELDS:
            continue
        forwarded = f"; vLLM's decoding fields it forwards: {', '.join(sorted(VLLM_FIELDS))}" if engine == "vllm" else ""
        return f"{name}: not accepted by this endpoint (engine {engine}){forwarded}"
    if engine == "peft":
        for name in PEFT_UNSUPPORTED:
            if getattr(request, name, None) is not None:
                return f"{name}: not supported by engine peft (serve with engine vllm for it)"
    return None


class RequestError(ValueError):
    """A request body the gateway refuses; the message names each wrong field, `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status, self.code = status, code


def invalid_text(document: Any) -> str | None:
    """Where (`messages.0.content`) the first string of a parsed JSON document is not valid Unicode (a lone
    surrogate such as `\\ud800`, which JSON's escapes allow and no tokenizer takes); None when every one is."""
    pending = deque([(document, "")])
    while pending:
        item, path = pending.popleft()
        if isinstance(item, str) and not is_unicode(item):
            return path or "body"
        if isinstance(item, dict):
            if not all(is_unicode(key) for key in item):
                return f"a key of {path or 'the body'}"
            pending.extend((value, f"{path}.{key}" if path else key) for key, value in item.items())
        elif isinstance(item, list):
            pending.extend((value, f"{path}.{index}" if path else str(index)) for index, value in enumerate(item))
    return None


def read_chat_request(raw: bytes, content_type: str | None) -> ChatRequest:
    """The request in a POST body: JSON (by its Content-Type, when it names one), nesting bounded, every string
    valid Unicode, every field as ChatRequest says; else a RequestError with the status to answer."""
    media = (content_type or JSON_MEDIA_TYPE).split(";")[0].strip().lower()
    if media != JSON_MEDIA_TYPE:
        raise RequestError(f"Content-Type {content_type!r} is not supported; send the body as {JSON_MEDIA_TYPE}", 415,
                           "unsupported_media_type")
    try:
        document = load_json(raw, "request body", standard=True)
    except TextInputError as problem:
        raise RequestError(str(problem), 400, "invalid_json") from None
    if (field := invalid_text(document)) is not None:
        raise RequestError(f"{field}: not valid Unicode text (a lone surrogate)", 400, "invalid_text")
    return parse_chat_request(document)


def parse_chat_request(document: Any) -> ChatRequest:
    return parse_request(ChatRequest, document)


Request = TypeVar("Request", bound=BaseModel)


def parse_request(model: type[Request], document: Any) -> Request:
    """`document` as `model`, else a RequestError naming each wrong field and why."""
    if not isinstance(document, dict):
        raise RequestError(f"request body must be a JSON object, got {type(document).__name__}")
    try:
        return model.model_validate(document)
    except ValidationError as error:
        problems = [f"{'.'.join(str(part) for part in e['loc']) or 'body'}: {e['msg'].removeprefix('Value error, ')}"
                    for e in error.errors()]
        raise RequestError("; ".join(problems)) from None
