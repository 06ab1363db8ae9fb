"""The README's pictures of the page, and an accessibility count beside them: launch the app on 127.0.0.1,
open it in Debian's Chromium at a desktop (1366 × 900) and a phone (390 × 844) size, write 龙马精神 with the
page's defaults, and save a full-page PNG of each; then count axe-core's serious and critical violations on
both tabs, before and after a couplet.

    python scripts/screenshots.py                       # docs/screenshots/{desktop,phone}.png
    python scripts/screenshots.py --out /tmp/before     # somewhere else (a before/after pair)
    python scripts/screenshots.py --no-axe              # pictures only

Uses Playwright with /usr/bin/chromium and the browser tests' helpers (tests/test_app_browser.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_app_browser import (  # noqa: E402
    ANIMATIONS_DONE,
    CHROMIUM,
    DESKTOP,
    PHONE,
    axe_serious,
    open_page,
    opened,
    save_screenshot,
)

SIZES = {"desktop": DESKTOP, "phone": PHONE}


def audit(page, name: str, stage: str, counts: dict[str, int]) -> None:
    """axe-core's serious and critical failures now, one count per failing element, each printed."""
    found = axe_serious(page)
    counts[stage] = sum(len(v["nodes"]) for v in found)
    for v in found:
        print(f"  {name}, {stage}: {v['id']} ({v['impact']}) on "
              + "; ".join(" ".join(n["target"]) for n in v["nodes"]))


def both_tabs(page, name: str, when: str, counts: dict[str, int]) -> None:
    audit(page, name, f"关键词 tab {when}", counts)
    page.click("#tasks button[role=tab]:has-text('对下联')")
    audit(page, name, f"对下联 tab {when}", counts)
    page.click("#tasks button[role=tab]:has-text('关键词写春联')")


def main(out: Path, axe: bool) -> None:
    import app

    demo = app.serve(port=0)
    app.warmed.wait(120)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            for name, viewport in SIZES.items():
                page = open_page(browser, demo.local_url, viewport)
                page.wait_for_selector("#kv-plot .js-plotly-plot")  # the page as a visitor first sees it, settled
                page.evaluate(ANIMATIONS_DONE)
                counts: dict[str, int] = {}
                if axe:
                    both_tabs(page, name, "before a couplet", counts)
                page.locator("#keywords").locator("input, textarea").first.fill("龙马精神")
                page.click("#open-btn")
                opened(page)
                page.evaluate(ANIMATIONS_DONE)
                page.evaluate("window.scrollTo(0, 0)")
                path = out / f"{name}.png"
                print(f"{path}: {save_screenshot(page, path)} bytes")
                if axe:
                    both_tabs(page, name, "after a couplet", counts)
                    print(f"{name} {viewport['width']}×{viewport['height']}: serious/critical axe-core failures: "
                          + ", ".join(f"{k} {v}" for k, v in counts.items()))
                page.context.close()
            browser.close()
    finally:
        demo.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots", help="folder for the PNGs")
    parser.add_argument("--no-axe", dest="axe", action="store_false", help="skip the axe-core counts")
    args = parser.parse_args()
    main(args.out, args.axe)
