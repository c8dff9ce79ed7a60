"""The Gradio chat UI in a real headless Chromium, against the real endpoint (gateway + transformers serve)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx
import pytest
from eval_fixtures import ROOT

from workloads.serve.process import free_port

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def chat_url(served, tmp_path_factory):
    port = free_port()
    env = {**os.environ, "FT_API_KEY": served.api_key, "GRADIO_ANALYTICS_ENABLED": "False"}
    log = tmp_path_factory.mktemp("chat") / "chat.log"
    proc = subprocess.Popen([sys.executable, "-m", "workloads.serve.chat", "--api", served.api, "--port", str(port),
                             "--max-tokens", "12"], cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
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
