"""Serving, by process: the gateway (gateway/, in the launcher's process), the CPU engine (engine/), the launcher
(launcher/), the publish stage (publish.py) and the clients (clients/); the pieces several processes share at the
top (http_shared, route, token_budget, request, auth, engine_key, registry)."""
