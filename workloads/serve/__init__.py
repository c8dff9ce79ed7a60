"""Serving: OpenAI-compatible endpoint (engine processes behind an authenticating gateway), chat UI, client."""
