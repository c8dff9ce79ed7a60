"""The gateway, the public face of the endpoint, run in the launcher's process: API-key check, request validation,
model names (base and each adapter), routing to engine processes, runtime adapter load/unload (admin, API key
always), per-name speed figures and the served set's files (served_report.py, served_restore.py).

Engines (`transformers serve`, the peft engine, vLLM) listen on loopback ports; the gateway streams their
responses through, replacing the engine's internal model id (a folder path) with the public name. Every request
is validated (shape, size, max_tokens, prompt length, fields the route's engine honours) before it reaches an
engine. Upstream, the gateway asks the transformers and peft engines for a stream and collects a non-streaming
reply from it; vLLM answers a non-streaming request itself (its logprobs and tool calls whole). Either way a
client who hangs up closes the engine's reply and the engine cancels the generation.
"""
