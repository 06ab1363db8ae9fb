"""The README's picture of the vLLM backend: a vLLM server (scripts/vllm_serve.sh, bf16, 14.05 MB of KV), the
page on it (`COUPLET_BACKEND=vllm python app.py`), 40 other visitors streaming on the same server meanwhile (the
gauges are the engine's, all requests together), and 龙马精神 written with vllm, full, int8 and combo.

    python scripts/screenshot_vllm.py [assets/screenshot_vllm.png]

Uses Debian's Chromium through Playwright and the browser tests' helpers (tests/test_app_browser.py).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_app_browser import ANIMATIONS_DONE, save_screenshot  # noqa: E402
from vllm_servers import page_on  # noqa: E402

from couplet.bench.serve import phrases  # noqa: E402
from couplet.bench.vllm import Server  # noqa: E402
from couplet.kvcache import KVGeometry  # noqa: E402
from couplet.models.loading import load_model  # noqa: E402
from couplet.serving.generate import CoupletRequest, prepare  # noqa: E402
from couplet.vllm_backend.client import VllmClient, prompt_for  # noqa: E402
from couplet.vllm_backend.logit_rules import spec_for  # noqa: E402

SHOWN = ("vllm", " full", " int8", " combo")  # the toggles left on (label fragments)


def main(out: Path) -> None:
    lm = load_model(None, "cpu", "float32")
    with Server(int(14.05 * 1024 * 1024), "bf16") as server:
        if not server.url:
            raise SystemExit(f"vLLM did not start: {server.refusal}")
        with page_on(server.url) as url:
            client = VllmClient(server.url, KVGeometry.of(lm.model))
            preps = [prepare(lm, CoupletRequest(k)) for k in phrases()[:40]]

            def visitor(prep, delay: float) -> None:
                time.sleep(delay)
                list(client.stream_tokens(prompt_for(lm, prep), spec_for(prep, lm.family), 0.0, 1.0, 0))

            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium")
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url)
                page.wait_for_selector("#modes label")
                for label in page.locator("#modes label").all():
                    if label.locator("input").is_checked() != any(k in label.inner_text() for k in SHOWN):
                        label.click()
                page.locator("#keywords").locator("input, textarea").first.fill("龙马精神")
                for i, prep in enumerate(preps):
                    threading.Thread(target=visitor, args=(prep, 0.5 + i * 0.05), daemon=True).start()
                time.sleep(1.0)
                page.click("#open-btn")
                page.wait_for_function("""n => document.querySelector('#gate')?.dataset.state === 'open'
                    && document.querySelectorAll('#modes-table tr[data-mode]').length === n""", arg=len(SHOWN),
                                       timeout=120_000)
                page.evaluate(ANIMATIONS_DONE)
                print(out, save_screenshot(page, out), "bytes")
                browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "assets" / "screenshot_vllm.png"))
