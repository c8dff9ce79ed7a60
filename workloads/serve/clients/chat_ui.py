"""A Gradio chat over any OpenAI-compatible endpoint: pick a served model (the base or an adapter), stream the
answer, see its timing; or ask two models the same question side by side, each answer with its timing.

    python -m workloads.serve.clients.chat_ui --api http://127.0.0.1:8000/v1 [--api-key KEY | env FT_API_KEY]

Listens on 127.0.0.1. `--share` (a public gradio.live link) and any non-loopback `--host` need login
credentials in FT_CHAT_USER and FT_CHAT_PASSWORD; without them the UI refuses to start.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
from collections.abc import Iterator

from workloads.serve.auth import AccessError, is_loopback
from workloads.serve.clients.openai_client import EndpointError, list_models, stream_chat

TIMING_PREFIX = "⏱ time to first token"


def timing_line(ttft_s: float | None, total_s: float | None) -> str:
    ttft = "n/a" if ttft_s is None else f"{ttft_s:.2f} s"
    total = "…" if total_s is None else f"{total_s:.2f} s"
    return f"{TIMING_PREFIX} {ttft} · total {total}"


def side_by_side(api: str, api_key: str | None, max_tokens: int, prompt: str, models: tuple[str, str]
                 ) -> Iterator[tuple[str, str]]:
    """Both models' answers to `prompt`, asked at once, as each grows (text, then its timing line)."""
    shown = ["", ""]
    updates: queue.Queue[tuple[int, str | None]] = queue.Queue()

    def ask(slot: int, model: str) -> None:
        try:
            for state in stream_chat(api, model, [{"role": "user", "content": prompt}], api_key=api_key,
                                     max_tokens=max_tokens):
                updates.put((slot, f"{state.text}\n\n*{timing_line(state.ttft_s, state.total_s)}*"))
        except (EndpointError, OSError) as error:
            updates.put((slot, f"**error:** {error}"))
        updates.put((slot, None))

    workers = [threading.Thread(target=ask, args=(slot, model), daemon=True) for slot, model in enumerate(models)]
    for worker in workers:
        worker.start()
    running = len(workers)
    while running:
        slot, text = updates.get()
        if text is None:
            running -= 1
            continue
        shown[slot] = f"**{models[slot]}**\n\n{text}"
        yield shown[0], shown[1]


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

        gr.Markdown("### Side by side: one question, two models")
        with gr.Row():
            left = gr.Dropdown(choices=models, value=models[0] if models else None, label="left",
                               elem_id="compare-left")
            right = gr.Dropdown(choices=models, value=default, label="right", elem_id="compare-right")
        question = gr.Textbox(placeholder="Ask both", show_label=False, elem_id="compare-prompt")
        ask_both = gr.Button("Ask both", elem_id="compare-send")
        with gr.Row():
            left_answer = gr.Markdown(elem_id="compare-left-answer")
            right_answer = gr.Markdown(elem_id="compare-right-answer")

        def compare(prompt: str, a: str, b: str) -> Iterator[tuple[str, str]]:
            if prompt.strip():
                yield from side_by_side(api, api_key, max_tokens, prompt, (a, b))

        for trigger in (question.submit, ask_both.click):
            trigger(compare, [question, left, right], [left_answer, right_answer])
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
