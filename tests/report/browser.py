"""Headless Chromium driven over the DevTools protocol with the standard library only.

Chromium's ``--remote-debugging-pipe`` reads NUL-terminated JSON commands on fd 3 and writes
responses and events on fd 4; a bash ``exec`` puts our pipe ends on those numbers.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)
ERROR_EVENTS = ("Runtime.exceptionThrown", "Runtime.consoleAPICalled", "Log.entryAdded")


class Browser:
    def __init__(self, timeout: float = 60.0):
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # move the child's ends above 9 so the redirections below never clobber one another
        to_browser_r, from_browser_w = (_above_nine(fd) for fd in (to_browser_r, from_browser_w))
        script = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-'
        self.process = subprocess.Popen(
            ["bash", "-c", script, str(CHROMIUM), *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE if os.environ.get("CHROMIUM_DEBUG") else subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    # -- protocol ------------------------------------------------------------------------
    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, session: str) -> dict:
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        while True:
            event = self._read()
            self.events.append(event)
            if event.get("method") == method and event.get("sessionId") == session:
                return event

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(left, 0))
            if not ready:
                raise TimeoutError(f"no message from chromium within {self.timeout} s")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    # -- what the tests use --------------------------------------------------------------
    def open(self, path: Path, width: int = 1200) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.send(f"{domain}.enable", session=session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session)
        self.wait_for("Page.loadEventFired", session)
        return Page(self, session)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._profile.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _above_nine(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def evaluate(self, expression: str):
        result = self.browser.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, self.session
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[dict]:
        """Uncaught exceptions, console errors/warnings and browser log errors (failed loads) of this page."""
        out = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session or event.get("method") not in ERROR_EVENTS:
                continue
            params = event["params"]
            if event["method"] == "Runtime.consoleAPICalled" and params.get("type") not in (
                "error",
                "warning",
                "assert",
            ):
                continue
            if event["method"] == "Log.entryAdded" and params["entry"].get("level") not in ("error", "warning"):
                continue
            out.append(event)
        return out

    def screenshot(self, path: Path) -> None:
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.browser.send(
            "Emulation.setDeviceMetricsOverride",
            {
                "width": int(self.evaluate("window.innerWidth")),
                "height": min(height, 16000),
                "deviceScaleFactor": 1,
                "mobile": False,
            },
            self.session,
        )
        data = self.browser.send("Page.captureScreenshot", {"format": "png"}, self.session)["data"]
        Path(path).write_bytes(base64.b64decode(data))
