"""The peft engine's Prometheus series under vLLM's own names, types, label names and bucket boundaries (vLLM
0.32's `PrometheusStatLogger`, vllm/v1/metrics/loggers.py; buckets from vllm/v1/metrics/buckets.py), so that a
dashboard built on a vLLM engine reads the peft engine unchanged. One registry per engine, served at the engine's
`GET /metrics` and relayed by the gateway's (workloads.serve.gateway.vllm_routes).

Exported, each meaning what it means in vLLM, with labels `model_name` (the served base's name, as vLLM's
`--served-model-name`) and `engine` ("0": one engine core):

- gauges `vllm:num_requests_running` (rows in the running batch, those being prefilled included) and
  `vllm:num_requests_waiting` (requests queued for the next step boundary or for room in the batch);
  `vllm:lora_requests_info` (labels `max_lora`, `running_lora_adapters`, `waiting_lora_adapters`: the adapters of
  the running and waiting requests, comma-joined, the base's rows left out; its value the time of the update, at
  every step as in vLLM, and once at start);
- counters `vllm:prompt_tokens`, `vllm:generation_tokens`, `vllm:request_success` (`finished_reason`: `stop` on
  an end-of-sequence token, `length` on `max_tokens`, `abort` for a request whose client hung up, `error` for
  the rows of a batch whose forward failed);
- histograms per finished request: `vllm:request_prompt_tokens`, `vllm:request_generation_tokens`,
  `vllm:request_max_num_generation_tokens`, `vllm:request_params_n` (always 1: n > 1 is refused),
  `vllm:request_params_max_tokens`, `vllm:e2e_request_latency_seconds`, `vllm:request_queue_time_seconds`,
  `vllm:request_inference_time_seconds`, `vllm:request_prefill_time_seconds`, `vllm:request_decode_time_seconds`,
  `vllm:request_time_per_output_token_seconds`; per token `vllm:time_to_first_token_seconds` and
  `vllm:inter_token_latency_seconds`; per forward `vllm:iteration_tokens_total`.

Generation tokens are counted as the replies' `usage.completion_tokens` counts them: the end-of-sequence token
that ends a request is not one (vLLM counts it in both); the timings take every step, that one included. Times
are measured from the moment the request is queued (after its prompt is rendered; vLLM's frontend stamps
arrival before). A request whose client hangs up while it waits counts in `request_success` (abort) only; one
that hangs up while running is observed like any finished request, as vLLM does for its aborts.

Left out, their meaning not holding here: `vllm:kv_cache_usage_perc` (the KV cache grows with the batch, no
fixed pool to be a share of), the prefix, external and multimodal caches (`vllm:prefix_cache_*`,
`vllm:external_prefix_cache_*`, `vllm:mm_cache_*`, `vllm:prompt_tokens_cached*`, `vllm:prompt_tokens_by_source`,
`vllm:request_prefill_kv_computed_tokens`: no cache, every prompt token is computed), preemption
(`vllm:num_preemptions`, `vllm:request_num_preemptions`: a row keeps its cache until it ends),
`vllm:num_requests_waiting_by_reason` and `vllm:num_requests_kv_fetch_by_stage` (no deferral, no KV transfer),
`vllm:engine_sleep_state` (no sleep mode), `vllm:cache_config_info` (vLLM's cache settings),
`vllm:admission_rejections` (the gateway's limits refuse before the engine), `vllm:corrupted_requests` and
`vllm:watermark_requests` (no NaN check, no watermarking), speculative decoding (`vllm:spec_decode_*`), KV
connectors, `vllm:estimated_*_per_gpu_total` (GPU performance estimates), the KV block residency and diffusion
series, and `finished_reason="repetition"` (no repetition detection).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

LABELS = ("model_name", "engine")
ENGINE_INDEX = "0"
FINISH_REASONS = ("stop", "length", "abort", "error")
"""vLLM's FinishReason strings this engine ends requests with (vLLM's `repetition` left out)."""
VLLM_DEFAULT_MAX_LEN = 2048
"""vLLM's max_model_len when the model's config states no context (vllm/config/model.py)."""

REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                               20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)

COUNTERS = {
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
}
HISTOGRAMS = {
    # name: (vLLM's documentation, bucket family)
    "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", "request_tokens"),
    "vllm:request_generation_tokens": ("Number of generation tokens processed.", "request_tokens"),
    "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.", "iteration_tokens"),
    "vllm:request_max_num_generation_tokens": (
        "Histogram of maximum number of requested generation tokens.", "request_tokens"),
    "vllm:request_params_n": ("Histogram of the n request parameter.", "request_params_n"),
    "vllm:request_params_max_tokens": ("Histogram of the max_tokens request parameter.", "request_tokens"),
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", "time_to_first_token"),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", "inter_token_latency"),
    "vllm:request_time_per_output_token_seconds": (
        "Histogram of time_per_output_token_seconds per request.", "inter_token_latency"),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", "request_latency"),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", "request_latency"),
    "vllm:request_inference_time_seconds": (
        "Histogram of time spent in RUNNING phase for request.", "request_latency"),
    "vllm:request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", "request_latency"),
    "vllm:request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", "request_latency"),
}


def one_two_five(max_value: int) -> tuple[int, ...]:
    """vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, ... up to `max_value` (the token-count buckets)."""
    found, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(found)
            found.append(mantissa * scale)
        scale *= 10


def bucket_families(max_model_len: int) -> dict[str, tuple[float, ...]]:
    return {"request_tokens": one_two_five(max_model_len), "iteration_tokens": ITERATION_TOKENS_BUCKETS,
            "request_params_n": REQUEST_PARAMS_N_BUCKETS, "time_to_first_token": TIME_TO_FIRST_TOKEN_BUCKETS,
            "inter_token_latency": INTER_TOKEN_LATENCY_BUCKETS, "request_latency": REQUEST_LATENCY_BUCKETS}


@dataclass
class RequestTimes:
    """One request's moments (time.monotonic()), as vLLM's RequestStateStats keeps them."""

    queued: float
    scheduled: float = 0.0
    first_token: float = 0.0
    last_token: float = 0.0
    steps: int = 0
    """tokens sampled for it so far (the end-of-sequence token that ends it included)"""

    @classmethod
    def now(cls) -> RequestTimes:
        return cls(time.monotonic())


class Timed(Protocol):
    """What the metrics read of a request (workloads.serve.engine.server.Generation)."""

    prompt_ids: list[int]
    max_tokens: int
    times: RequestTimes


class EngineMetrics:
    """The series of one engine in a registry of its own; the worker thread updates them, /metrics renders them."""

    def __init__(self, model_name: str, max_model_len: int, max_loras: int) -> None:
        self.registry = CollectorRegistry()
        self.labels = (model_name, ENGINE_INDEX)
        self.max_loras = max_loras
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                             LABELS, registry=self.registry).labels(*self.labels)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                             LABELS, registry=self.registry).labels(*self.labels)
        self.counters = {name: Counter(name, doc, LABELS, registry=self.registry).labels(*self.labels)
                         for name, doc in COUNTERS.items()}
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          (*LABELS, "finished_reason"), registry=self.registry)
        self.success = {reason: success.labels(*self.labels, reason) for reason in FINISH_REASONS}
        families = bucket_families(max_model_len)
        self.histograms = {name: Histogram(name, doc, LABELS, registry=self.registry,
                                           buckets=families[family]).labels(*self.labels)
                           for name, (doc, family) in HISTOGRAMS.items()}
        self.lora_info = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                               ("max_lora", "waiting_lora_adapters", "running_lora_adapters"), registry=self.registry)
        self.adapters([], [])

    def watch(self, running: Callable[[], float], waiting: Callable[[], float]) -> None:
        """The two gauges read at each scrape from the worker's own state."""
        self.running.set_function(running)
        self.waiting.set_function(waiting)

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition the scraper's Accept header asks for (Prometheus text by default), and its media type."""
        encoder, media_type = choose_encoder(accept)
        return encoder(self.registry), media_type

    def adapters(self, running: Iterable[str], waiting: Iterable[str]) -> None:
        """vLLM's lora_requests_info: the adapters in use now, stamped with the time."""
        self.lora_info.labels(max_lora=str(self.max_loras), waiting_lora_adapters=",".join(sorted(set(waiting))),
                              running_lora_adapters=",".join(sorted(set(running)))).set_to_current_time()

    def iteration(self, prompt_tokens: int, sampled: int) -> None:
        """One forward: the prompt tokens it prefilled and the tokens it sampled (one per row)."""
        if prompt_tokens:
            self.counters["vllm:prompt_tokens"].inc(prompt_tokens)
        self.histograms["vllm:iteration_tokens_total"].observe(prompt_tokens + sampled)

    def scheduled(self, request: Timed, now: float) -> None:
        request.times.scheduled = now

    def token(self, request: Timed, now: float, counted: bool) -> None:
        """A token sampled for a running request; `counted` unless it is the end-of-sequence token ending it."""
        times = request.times
        if times.steps == 0:
            times.first_token = now
            self.histograms["vllm:time_to_first_token_seconds"].observe(now - times.queued)
        else:
            self.histograms["vllm:inter_token_latency_seconds"].observe(now - times.last_token)
        times.last_token, times.steps = now, times.steps + 1
        if counted:
            self.counters["vllm:generation_tokens"].inc()

    def unscheduled(self, reason: str) -> None:
        """A request that ended before it joined the batch: its client hung up (abort), or its prefill failed."""
        self.success[reason].inc()

    def finished(self, request: Timed, reason: str, generated: int, now: float) -> None:
        """A request that left the batch: `reason` one of FINISH_REASONS, `generated` its usage's tokens."""
        times, observe = request.times, self.histograms
        self.success[reason].inc()
        decode = times.last_token - times.first_token if times.steps else 0.0
        for name, value in (
                ("vllm:e2e_request_latency_seconds", now - times.queued),
                ("vllm:request_queue_time_seconds", times.scheduled - times.queued),
                ("vllm:request_prefill_time_seconds", times.first_token - times.scheduled if times.steps else 0.0),
                ("vllm:request_decode_time_seconds", decode),
                ("vllm:request_inference_time_seconds",
                 (times.last_token if times.steps else now) - times.scheduled),
                ("vllm:request_time_per_output_token_seconds", decode / (times.steps - 1) if times.steps > 1 else 0.0),
                ("vllm:request_prompt_tokens", len(request.prompt_ids)),
                ("vllm:request_generation_tokens", generated),
                ("vllm:request_max_num_generation_tokens", generated),
                ("vllm:request_params_n", 1),
                ("vllm:request_params_max_tokens", request.max_tokens)):
            observe[name].observe(value)
