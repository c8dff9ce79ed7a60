"""A client hanging up in the middle of a streamed reply closes the engine's stream at once (the engine then stops
the generation: workloads/serve/engine/batching.py drops a cancelled row at its next token). The gateway's stream
(workloads/serve/gateway/stream_end.py) played through Starlette's own StreamingResponse as uvicorn drives it
(ASGI 2.3: the response listens for the disconnect and cancels the stream), the engine's side a generator whose
next line never comes."""

from __future__ import annotations

import asyncio

from fastapi.responses import StreamingResponse

from workloads.serve.gateway.stream_end import ended_like_openai, until_closing

LOOP_TURNS = 50
"""event-loop turns the engine's stream gets to close after the response returns (a count, not a clock)"""


async def hang_up_after_the_first_line() -> tuple[bool, list[bytes]]:
    closed, hung_up = asyncio.Event(), asyncio.Event()

    async def engine_lines():
        try:
            yield 'data: {"choices": [{"delta": {"content": "4"}}]}\n\n'
            await asyncio.Event().wait()  # the engine's next token: the client is gone before it comes
        finally:
            closed.set()  # here the gateway closes its request to the engine

    async def receive() -> dict:
        await hung_up.wait()
        return {"type": "http.disconnect"}

    bodies: list[bytes] = []

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message["body"]:
            bodies.append(message["body"])
            hung_up.set()

    stream = ended_like_openai(until_closing(engine_lines(), asyncio.Event()), "base")
    await StreamingResponse(stream, media_type="text/event-stream")(
        {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}, receive, send)
    for _ in range(LOOP_TURNS):
        if closed.is_set():
            break
        await asyncio.sleep(0)
    return closed.is_set(), bodies


def test_a_client_hanging_up_mid_stream_closes_the_engines_stream() -> None:
    closed, bodies = asyncio.run(hang_up_after_the_first_line())
    assert len(bodies) == 1 and b'"4"' in bodies[0]
    assert closed, "the engine's stream was left open after the client hung up"
