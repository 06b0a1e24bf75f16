"""The tour's pages as docs/dashboard.md shows them: ``bubblescope demo --tour`` into a real service, then headless
Chromium's screenshots of the run list and of some stops' pages (the glance card, and the first screen) at 1440 and
900 px. Prints how long the tour took and each page's first line (the verdict, in that run's own figures).

    python bench/tour_pages.py [--out docs/dashboard] [--pages layerwise,imbalanced,late-rank,hang,1024-ranks]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bubblescope.demo import TOUR_SILENT_AFTER_S
from tests.support import migrated_database, start_server

WIDTHS = (1440, 900)


def screenshots(url: str, keys: dict[str, str], pages: list[str], out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(f"{url}/")
            page.wait_for_selector("#runs tbody tr .run-title")
            page.screenshot(path=str(out / f"tour-runs-{width}.png"))
            for slug in pages:
                page.goto(f"{url}/runs/{keys[slug]}")
                page.wait_for_selector("body[data-drawn='true']", timeout=120_000)
                page.locator("#glance").screenshot(path=str(out / f"tour-{slug}-glance-{width}.png"))
                page.screenshot(path=str(out / f"tour-{slug}-page-{width}.png"))  # what the first screen shows
                if width == WIDTHS[0]:
                    print(f"{slug:11s} {page.locator('#glance-verdict').inner_text()}", flush=True)
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("test-output/dashboard"))
    parser.add_argument("--pages", default="layerwise,imbalanced,late-rank,hang,1024-ranks")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bubblescope-tour-"))
    with migrated_database("sqlite", folder) as db:
        live = start_server(
            db, folder, extra_args=["--silent-after", str(TOUR_SILENT_AFTER_S)]
        )  # as the demo serves it
        try:
            began = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "bubblescope.cli", "demo", "--tour", "--url", live.url],
                capture_output=True,
                text=True,
                check=True,
            )
            print(f"tour: {time.monotonic() - began:.0f} s", flush=True)
            keys = {slug: key for key, slug in re.findall(r"/runs/(tour-\d+-(\S+)-\w+)$", done.stdout, re.M)}
            screenshots(live.url, keys, args.pages.split(","), args.out)
        finally:
            live.stop()


if __name__ == "__main__":
    main()
