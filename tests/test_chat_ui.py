"""The Gradio chat UI in a real headless Chromium, against the real endpoint (gateway + transformers serve)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from eval_fixtures import ROOT

from serve_process import free_port

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def chat_ui(api: str, api_key: str, log: Path, max_tokens: int) -> Iterator[str]:
    """`workloads.serve.clients.chat_ui` against `api` on a free loopback port, until it answers; its URL."""
    port = free_port()
    env = {**os.environ, "FT_API_KEY": api_key, "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.Popen([sys.executable, "-m", "workloads.serve.clients.chat_ui", "--api", api, "--port", str(port),
                             "--max-tokens", str(max_tokens)], cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(120):
            if proc.poll() is not None:
                pytest.fail(f"chat UI exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def chat_url(served, tmp_path_factory):
    with chat_ui(served.api, served.api_key, tmp_path_factory.mktemp("chat") / "chat.log", 12) as url:
        yield url


def test_send_a_message_and_read_the_streamed_answer_with_timing(chat_url) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not found (Debian package chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(chat_url, wait_until="domcontentloaded")
            model = page.locator("#model-select input")
            model.wait_for(timeout=60_000)
            assert model.input_value() == "finetuned"
            page.locator("#prompt textarea").fill("What is a credit score?")
            page.locator("#send").click()
            bot = page.locator("#chat .message.bot, #chat [data-testid='bot']").last
            bot.wait_for(timeout=60_000)
            page.wait_for_function(
                "() => /total \\d+\\.\\d+ s/.test(document.querySelector('#chat').innerText)", timeout=300_000)
            text = page.locator("#chat").inner_text()
        finally:
            browser.close()
    assert "What is a credit score?" in text
    match = re.search(r"(?s)What is a credit score\?(.*?)⏱ time to first token (\d+\.\d+) s · total (\d+\.\d+) s", text)
    assert match, text
    answer, ttft, total = match.group(1).strip(), float(match.group(2)), float(match.group(3))
    assert answer and 0 < ttft <= total


@pytest.fixture(scope="module")
def adapters_chat(adapter_runs, tmp_path_factory):
    """The chat UI in front of one server with the base and three adapters."""
    from adapter_fixtures import ADAPTERS, adapter_server

    work = tmp_path_factory.mktemp("adapters-chat")
    with adapter_server(adapter_runs, work / "serve", list(ADAPTERS)) as server, \
            chat_ui(f"{server.url}/v1", server.key, work / "chat.log", 10) as url:
        yield url, server


def _pick(page, elem_id: str, name: str) -> None:
    box = page.locator(f"#{elem_id} input")
    box.click()
    page.locator(f"#{elem_id}").get_by_role("option", name=name, exact=True).click()
    page.wait_for_function(f"() => document.querySelector('#{elem_id} input').value === '{name}'", timeout=30_000)


def test_switch_adapters_and_compare_two_side_by_side(adapters_chat) -> None:
    from playwright.sync_api import sync_playwright

    url, server = adapters_chat
    question = "What is a bond?"
    expected = {}
    for name in ("desk-filings", "desk-earnings", "desk-credit"):
        body = {"model": name, "messages": [{"role": "user", "content": question}], "max_tokens": 10, "temperature": 0.0}
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.headers, timeout=120)
        expected[name] = reply.json()["choices"][0]["message"]["content"].strip()
    assert len(set(expected.values())) == 3, expected
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(url, wait_until="domcontentloaded")
            page.locator("#model-select input").wait_for(timeout=60_000)
            _pick(page, "model-select", "desk-filings")
            page.locator("#prompt textarea").fill(question)
            page.locator("#send").click()
            page.wait_for_function(
                "() => /total \\d+\\.\\d+ s/.test(document.querySelector('#chat').innerText)", timeout=300_000)
            chat = page.locator("#chat").inner_text()
            _pick(page, "compare-left", "desk-earnings")
            _pick(page, "compare-right", "desk-credit")
            page.locator("#compare-prompt textarea").fill(question)
            page.locator("#compare-send").click()
            page.wait_for_function(
                "() => ['#compare-left-answer', '#compare-right-answer'].every("
                "id => /total \\d+\\.\\d+ s/.test(document.querySelector(id).innerText))", timeout=300_000)
            left = page.locator("#compare-left-answer").inner_text()
            right = page.locator("#compare-right-answer").inner_text()
            (ROOT / ".local" / "screenshots").mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ROOT / ".local" / "screenshots" / "chat-side-by-side.png"), full_page=True)
        finally:
            browser.close()
    assert " ".join(expected["desk-filings"].split()) in " ".join(chat.split())
    for text, name in ((left, "desk-earnings"), (right, "desk-credit")):
        assert text.startswith(name), text
        assert " ".join(expected[name].split()) in " ".join(text.split()), (name, text)
        ttft, total = map(float, re.search(r"time to first token (\d+\.\d+) s · total (\d+\.\d+) s", text).groups())
        assert 0 < ttft <= total
