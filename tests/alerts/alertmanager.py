"""A real Alertmanager for tests (Debian's ``prometheus-alertmanager``) on free loopback ports.

``running_alertmanager(folder, config)`` starts one with ``config`` (YAML text), waits until it is
ready and yields its base URL; ``webhook_route(url)`` is a config that routes every alert to one
webhook receiver with short group waits. The test skips when the binary is not installed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support import free_port, require_program, wait_until

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
START_TIMEOUT_S = 60


def webhook_route(url: str, group_wait: str = "1s", group_interval: str = "1s") -> str:
    """A config sending every alert, grouped by alertname and run, to the webhook ``url``, resolutions too."""
    return (
        "route:\n"
        "  receiver: test\n"
        "  group_by: [alertname, run]\n"
        f"  group_wait: {group_wait}\n"
        f"  group_interval: {group_interval}\n"
        "  repeat_interval: 1h\n"
        "receivers:\n"
        "  - name: test\n"
        "    webhook_configs:\n"
        f"      - url: '{url}'\n"
        "        send_resolved: true\n"
    )


@contextmanager
def running_alertmanager(folder: Path, config: str) -> Iterator[str]:
    require_program(ALERTMANAGER, "prometheus-alertmanager")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "alertmanager.yml").write_text(config)
    port = free_port()
    log_path = folder / "alertmanager.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                ALERTMANAGER,
                f"--config.file={folder / 'alertmanager.yml'}",
                f"--storage.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",  # a single instance: no gossip port
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert process.poll() is None, f"alertmanager exited: {log_path.read_text()[-2000:]}"
            try:
                return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(ready, START_TIMEOUT_S, "alertmanager to start", interval_s=0.1)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(15)
