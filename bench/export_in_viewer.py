"""A run's Perfetto export (``GET /runs/{key}/trace``) opened in a third-party trace viewer, for docs/traces.md.

ui.perfetto.dev cannot be reached from the machine the docs are made on, and headless Chromium serves no
chrome://tracing, so the export is opened in speedscope (an offline viewer of Chrome trace-event JSON, from npm):
one timeline per rank and category thread, the slices nested as exported. Needs ``npm`` and Debian's chromium::

    (cd /tmp && npm pack speedscope@1.25.0 && tar xzf speedscope-1.25.0.tgz)   # -> /tmp/package/dist/release
    python bench/export_in_viewer.py --speedscope /tmp/package/dist/release --out docs/dashboard

It runs ``bubblescope demo`` (2 stages, 1F1B, on embedded SQLite), serves the database, downloads the export of
one step and screenshots the viewer at 1440 and 900 px.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import http.server
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speedscope", type=Path, required=True, help="speedscope's dist/release folder")
    parser.add_argument("--out", type=Path, default=Path("test-output"), help="where the screenshots go")
    parser.add_argument("--step", type=int, default=6)
    parser.add_argument("--thread", type=int, default=5, help="which of the export's threads to show (1: the first)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bubblescope-viewer-"))
    db = f"sqlite:///{work / 'demo.db'}"
    demo = [sys.executable, "-m", "bubblescope.cli", "demo", "--stages", "2", "--steps", "8", "--microbatches", "4"]
    subprocess.run([*demo, "--db", db, "--port", str(free_port()), "--exit-after-job"], check=True, timeout=600)
    port = free_port()
    service = subprocess.Popen([sys.executable, "-m", "bubblescope.cli", "serve", "--db", db, "--port", str(port)])
    try:
        url = f"http://127.0.0.1:{port}/api/v1"
        for _ in range(100):
            try:
                runs = json.load(urllib.request.urlopen(f"{url}/runs"))
                break
            except OSError:
                time.sleep(0.2)
        key = runs[0]["key"]
        with urllib.request.urlopen(f"{url}/runs/{key}/trace?from_step={args.step}&to_step={args.step}") as answer:
            export = answer.read()
        if export[:2] == b"\x1f\x8b":  # sent gzip-encoded, which urllib leaves as it came
            export = gzip.decompress(export)
    finally:
        service.terminate()
        service.wait(30)
    site = work / "site"
    shutil.copytree(args.speedscope, site)
    (site / "export.json").write_bytes(export)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
        for width in (1440, 900):
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(f"http://127.0.0.1:{server.server_port}/index.html#profileURL=/export.json&title={key}")
            page.wait_for_timeout(4000)
            for _ in range(args.thread - 1):  # speedscope shows one thread at a time: "n" moves to the next
                page.keyboard.press("n")
            page.wait_for_timeout(500)
            page.screenshot(path=str(args.out / f"export-in-speedscope-{width}.png"))
            page.close()
        browser.close()
    server.shutdown()
    print(f"run {key}, step {args.step}: {len(export)} bytes of export; screenshots in {args.out}")


if __name__ == "__main__":
    main()
