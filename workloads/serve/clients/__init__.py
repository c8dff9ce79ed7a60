"""Clients of any OpenAI-compatible endpoint: the streaming HTTP client (openai_client.py) and the Gradio chat UI
(chat_ui.py), each in the user's process."""
