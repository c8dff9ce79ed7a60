"""The bodies of vLLM's /v1/completions, /tokenize and /detokenize as the gateway takes them (issue 64 item 6),
validated as chat requests are (workloads.serve.request): each field is one the gateway checks (type and limit),
one of vLLM's decoding fields forwarded as given, or refused with a 400 naming it. vLLM itself drops a field it
does not know (`best_of: 1000` answered 200) and decodes a token id past the vocabulary as nothing
(`/detokenize [1e9]` answered `{"prompt": ""}`); the gateway checks token ids against the served tokenizer's
vocabulary.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from workloads.serve.request import SEED_RANGE, ChatMessage, RequestError, parse_request

MAX_PROMPTS = 64
"""prompts in one /v1/completions request (each generates its own reply)"""
MAX_LOGPROBS = 20
"""vLLM's default --max-logprobs"""

COMPLETION_VLLM_FIELDS = frozenset({
    "top_k", "min_p", "repetition_penalty", "length_penalty", "min_tokens", "stop_token_ids", "logit_bias",
    "bad_words", "allowed_token_ids", "include_stop_str_in_output", "skip_special_tokens",
    "spaces_between_special_tokens", "structured_outputs", "prompt_logprobs", "use_beam_search", "return_token_ids",
    "ignore_eos", "add_special_tokens", "response_format", "truncate_prompt_tokens",
})
"""Fields of vLLM's CompletionRequest beyond the ones declared below (vllm/entrypoints/openai/completion/
protocol.py, v0.32.0) that steer decoding only: forwarded. Its others (suffix, which vLLM refuses anyway,
prompt_embeds, priority, request_id, kv_transfer_params, vllm_xargs, ...) are the server's to set: refused."""

TokenId = Annotated[StrictInt, Field(ge=0)]
Probability = Annotated[float, Field(gt=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class CompletionRequest(BaseModel):
    """POST /v1/completions: OpenAI's fields with their limits, vLLM's decoding fields kept aside (`model_extra`)."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr
    prompt: StrictStr | list[StrictStr] | list[TokenId] | list[list[TokenId]]
    max_tokens: StrictInt | None = Field(None, ge=1)
    n: StrictInt | None = None
    best_of: StrictInt | None = None
    echo: StrictBool | None = None
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    temperature: StrictFloat | StrictInt | None = Field(None, ge=0.0, le=2.0)
    top_p: Probability | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: StrictInt | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    user: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("at least one prompt (a string, a list of strings or of token ids)")
        if isinstance(value, list) and isinstance(value[0], (str, list)) and len(value) > MAX_PROMPTS:
            raise ValueError(f"{len(value)} prompts, over this endpoint's limit of {MAX_PROMPTS} per request")
        return value

    @field_validator("n", "best_of")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError(f"{value} asked; this endpoint returns one choice per prompt (1, or leave it out: "
                             "vLLM 0.32 has no best_of and would ignore it)")
        return value

    def token_ids(self) -> list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            return [token for row in prompt for token in row]
        return [token for token in prompt if isinstance(token, int)] if isinstance(prompt, list) else []


class TokenizeRequest(BaseModel):
    """POST /tokenize: a prompt, or chat messages (rendered with the server's own chat template)."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool | None = None
    return_token_strs: StrictBool | None = None


class DetokenizeRequest(BaseModel):
    """POST /detokenize: token ids, each within the vocabulary."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr
    tokens: list[TokenId]


def no_other_field(request: BaseModel, forwarded: frozenset[str], route: str) -> None:
    """RequestError naming the first field `route` neither checks nor forwards."""
    for name in request.model_extra or {}:
        if name not in forwarded:
            also = f"; vLLM's decoding fields it forwards: {', '.join(sorted(forwarded))}" if forwarded else ""
            raise RequestError(f"{name}: not accepted by {route}{also}", 400, "invalid_request")


def within_vocabulary(tokens: list[int], size: int | None, field: str) -> None:
    if size is not None and tokens and max(tokens) >= size:
        raise RequestError(f"{field}: token id {max(tokens)} is outside the vocabulary (ids 0 to {size - 1})", 400,
                           "invalid_request")


def checked_completion(document: dict[str, Any], vocabulary: int | None) -> None:
    request = parse_request(CompletionRequest, document)
    no_other_field(request, COMPLETION_VLLM_FIELDS, "POST /v1/completions")
    within_vocabulary(request.token_ids(), vocabulary, "prompt")


def checked_tokenize(document: dict[str, Any]) -> None:
    request = parse_request(TokenizeRequest, document)
    no_other_field(request, frozenset(), "POST /tokenize (a server setting, or no field of it)")
    if (request.prompt is None) == (request.messages is None):
        raise RequestError("prompt or messages: give exactly one", 400, "invalid_request")


def checked_detokenize(document: dict[str, Any], vocabulary: int | None) -> None:
    request = parse_request(DetokenizeRequest, document)
    no_other_field(request, frozenset(), "POST /detokenize")
    within_vocabulary(request.tokens, vocabulary, "tokens")
