"""A Gradio chat over any OpenAI-compatible endpoint: pick a served model, stream the answer, see its timing.

    python -m workloads.serve.chat --api http://127.0.0.1:8000/v1 [--api-key KEY | env FT_API_KEY]

Listens on 127.0.0.1. `--share` (a public gradio.live link) and any non-loopback `--host` need login
credentials in FT_CHAT_USER and FT_CHAT_PASSWORD; without them the UI refuses to start.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from workloads.serve.auth import AccessError, is_loopback
from workloads.serve.client import EndpointError, list_models, stream_chat

TIMING_PREFIX = "⏱ time to first token"


def timing_line(ttft_s: float | None, total_s: float | None) -> str:
    ttft = "n/a" if ttft_s is None else f"{ttft_s:.2f} s"
    total = "…" if total_s is None else f"{total_s:.2f} s"
    return f"{TIMING_PREFIX} {ttft} · total {total}"


def check_exposure(host: str, share: bool, auth: tuple[str, str] | None) -> None:
    if (share or not is_loopback(host)) and auth is None:
        where = "a public share link" if share else f"host {host}"
        raise AccessError(f"refusing {where} without login: set FT_CHAT_USER and FT_CHAT_PASSWORD")


def auth_from_env() -> tuple[str, str] | None:
    user, password = os.environ.get("FT_CHAT_USER", ""), os.environ.get("FT_CHAT_PASSWORD", "")
    return (user, password) if user and password else None


def build_ui(api: str, api_key: str | None, max_tokens: int):
    import gradio as gr

    models = list_models(api, api_key)
    default = next((m for m in models if m != "base"), models[0]) if models else None

    def respond(message: str, model: str, shown: list[dict], clean: list[dict]) -> Iterator[tuple]:
        if not message.strip():
            yield shown, clean, ""
            return
        clean = clean + [{"role": "user", "content": message}]
        shown = shown + [{"role": "user", "content": message}, {"role": "assistant", "content": ""}]
        answer, ttft, total = "", None, None
        try:
            for state in stream_chat(api, model, clean, api_key=api_key, max_tokens=max_tokens):
                answer, ttft, total = state.text, state.ttft_s, state.total_s
                shown[-1] = {"role": "assistant", "content": f"{answer}\n\n*{timing_line(ttft, total)}*"}
                yield shown, clean, ""
        except (EndpointError, OSError) as error:
            shown[-1] = {"role": "assistant", "content": f"**error:** {error}"}
            yield shown, clean[:-1], ""
            return
        yield shown, clean + [{"role": "assistant", "content": answer}], ""

    with gr.Blocks(title="InnovationBank assistant") as demo:
        gr.Markdown(f"### Chat with the served models\nEndpoint: `{api}`")
        model = gr.Dropdown(choices=models, value=default, label="model", elem_id="model-select")
        chatbot = gr.Chatbot(label="conversation", elem_id="chat", height=480)
        clean = gr.State([])
        box = gr.Textbox(placeholder="Ask a question and press Enter", show_label=False, elem_id="prompt")
        send = gr.Button("Send", elem_id="send")
        clear = gr.Button("New conversation")
        for trigger in (box.submit, send.click):
            trigger(respond, [box, model, chatbot, clean], [chatbot, clean, box])
        clear.click(lambda: ([], []), None, [chatbot, clean])
    return demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api", required=True, help="base URL of the endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=None, help="API key (default: env FT_API_KEY)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--share", action="store_true", help="public gradio.live link (needs FT_CHAT_USER/PASSWORD)")
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    api_key = args.api_key or os.environ.get("FT_API_KEY") or None
    auth = auth_from_env()
    try:
        check_exposure(args.host, args.share, auth)
        demo = build_ui(args.api, api_key, args.max_tokens)
    except (AccessError, EndpointError, OSError) as error:
        print(f"chat: {error}", file=sys.stderr)
        return 2
    demo.queue().launch(server_name=args.host, server_port=args.port, share=args.share, auth=auth, quiet=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
