"""The CPU engine, a process of its own behind the gateway: one base model and every adapter on it with peft
(server.py), continuous batching (batching.py), the adapters stacked per layer (stacked_lora.py) and vLLM's
Prometheus series (metrics.py). It imports nothing of the gateway."""
