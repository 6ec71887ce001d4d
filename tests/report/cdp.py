"""cdp.py - a small Chrome DevTools Protocol client over a pipe (stdlib only) for the
report's browser test: headless Chromium (Debian `chromium`) started with
--remote-debugging-pipe reads commands on its fd 3 and writes replies and events on its
fd 4, one JSON message each, NUL-terminated."""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional


def find_chromium() -> Optional[str]:
    """The Chromium binary: $CHROMIUM, else chromium / chromium-browser on PATH."""
    for c in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


class CdpError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page attached (flat session)."""

    def __init__(self, binary: str, width: int = 1280, height: int = 900, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.events: List[Dict[str, Any]] = []
        self._buf = b""
        self._id = 0
        self.profile = tempfile.mkdtemp(prefix="kvq-cdp-")
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def child() -> None:  # the pipes at fds 3 (commands) and 4 (replies)
            a, b = os.dup(cmd_r), os.dup(res_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [binary, "--headless", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
                f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")
        self._log = open(os.path.join(self.profile, "stderr.log"), "wb")
        self.proc = subprocess.Popen(args, preexec_fn=child, close_fds=False, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self._log)
        os.close(cmd_r)
        os.close(res_w)
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=True)

    # ---- the wire ----------------------------------------------------------------------
    def _read_message(self, deadline: float) -> Dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("chromium: no reply in time")
            r, _, _ = select.select([self._res_r], [], [], left)
            if not r:
                continue
            chunk = os.read(self._res_r, 1 << 20)
            if not chunk:
                with open(self._log.name, "rb") as f:
                    err = f.read().decode(errors="replace")
                raise CdpError(f"chromium closed the pipe (exit {self.proc.poll()}): {err[-2000:]}")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, session: bool = False) -> Dict[str, Any]:
        """Sends one command and returns its result (events meanwhile go to self.events)."""
        self._id += 1
        msg: Dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise CdpError(f"{method}: {m['error']}")
                return m.get("result", {})
            if "method" in m:
                self.events.append(m)

    def wait_event(self, method: str) -> Dict[str, Any]:
        for e in self.events:
            if e["method"] == method:
                return e
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read_message(deadline)
            if "method" in m:
                self.events.append(m)
                if m["method"] == method:
                    return m

    # ---- what the test uses ------------------------------------------------------------
    def load(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in r:
            raise CdpError(f"evaluate: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, full_page: bool = True, max_height: int = 0) -> bytes:
        params: Dict[str, Any] = {"format": "png"}
        if full_page:
            m = self.call("Page.getLayoutMetrics", session=True)
            size = m.get("cssContentSize") or m["contentSize"]
            h = size["height"] if not max_height else min(size["height"], max_height)
            params.update({"captureBeyondViewport": True,
                           "clip": {"x": 0, "y": 0, "width": size["width"], "height": h, "scale": 1}})
        return base64.b64decode(self.call("Page.captureScreenshot", params, session=True)["data"])

    def problems(self) -> List[str]:
        """Console errors and warnings, uncaught exceptions, log entries of level error or
        warning, and failed loads, as lines."""
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p.get('args', [])]}")
            elif m == "Runtime.exceptionThrown":
                out.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif m == "Network.loadingFailed":
                out.append(f"load failed: {p.get('errorText')}")
        return out

    def requests(self) -> List[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (CdpError, OSError):
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
