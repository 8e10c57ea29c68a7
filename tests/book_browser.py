"""A static web server and a headless Chromium, driven over the DevTools protocol.

Used by ``tests/test_book.py`` to look at the built book the way a reader's browser does.
No browser-automation package is needed: Debian's ``chromium`` speaks the Chrome DevTools
Protocol (CDP) over a WebSocket, and ``websocket-client`` (already in the environment, via
jupyter_server) is enough to talk to it.

    with serve_directory(site_dir, "/book/") as base_url, Browser() as browser:
        page = browser.open(base_url + "index.html")   # waits for the load event
        assert not page.errors                         # console errors, failed requests
        browser.screenshot("index.png")
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import websocket

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--disable-default-apps", "--hide-scrollbars", "--mute-audio",
]


def find_chromium() -> str:
    """Path of Debian's chromium (installed by scripts/install-system-deps.sh)."""
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    raise RuntimeError("chromium is not installed: run `bash scripts/install-system-deps.sh`")


# --- a static web server under a sub-path ---------------------------------------------------

class _SubPathHandler(http.server.SimpleHTTPRequestHandler):
    """Serves ``directory`` at ``prefix`` only; every other path is a 404, as on a host
    that publishes the book under a sub-path (GitHub Pages: ``/<repository>/``)."""

    prefix = "/"
    requests: list

    def translate_path(self, path):
        local = path.split("?", 1)[0].split("#", 1)[0]
        if not local.startswith(self.prefix):
            return str(Path(self.directory) / "__outside_the_prefix__" / "404")  # never exists
        return super().translate_path("/" + local[len(self.prefix):])

    def send_response(self, code, message=None):
        self.requests.append((self.path, code))
        super().send_response(code, message)

    def log_message(self, *args):  # keep the test output quiet
        pass


@contextlib.contextmanager
def serve_directory(directory: Path, prefix: str):
    """Serve ``directory`` on 127.0.0.1 (a free port) at URL path ``prefix``.

    Yields the base URL, e.g. ``http://127.0.0.1:41234/distlab/``. The list of
    ``(path, status)`` of every request is available as ``base_url.requests``.
    """
    requests: list = []
    handler = functools.partial(
        type("Handler", (_SubPathHandler,), {"prefix": prefix, "requests": requests}),
        directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield _BaseURL(f"http://127.0.0.1:{server.server_address[1]}{prefix}", requests)
    finally:
        server.shutdown()
        server.server_close()


class _BaseURL(str):
    def __new__(cls, url, requests):
        self = super().__new__(cls, url)
        self.requests = requests
        return self


# --- Chromium over the DevTools protocol ---------------------------------------------------

@dataclass
class Page:
    """What happened while one URL loaded."""

    url: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


def _is_implicit_favicon(url: str) -> bool:
    """Chromium asks every host for /favicon.ico by itself; a site under a sub-path
    cannot answer that, and no page asked for it."""
    parts = urllib.parse.urlsplit(url)
    return parts.path == "/favicon.ico"


class Browser:
    """One headless Chromium with one tab; ``open`` a URL, ``evaluate`` JavaScript in it."""

    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 30.0):
        self.timeout = timeout
        self.profile = Path(tempfile.mkdtemp(prefix="distlab-chromium-"))
        self.process = subprocess.Popen(
            [find_chromium(), *CHROMIUM_FLAGS, f"--window-size={width},{height}",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self._wait_for_port()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                targets = json.load(r)
            tab = next(t for t in targets if t["type"] == "page")
            self.ws = websocket.create_connection(tab["webSocketDebuggerUrl"], timeout=timeout,
                                                  suppress_origin=True)
            self._next_id = 0
            self._events: list[dict] = []
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.send(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _wait_for_port(self) -> int:
        """Chromium writes the port it picked into DevToolsActivePort in its profile."""
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.process.returncode}")
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.05)
        raise TimeoutError("chromium did not open its DevTools port")

    def send(self, method: str, **params):
        """Call a DevTools method and return its result; events that arrive are kept."""
        self._next_id += 1
        call_id = self._next_id
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._events.append(message)

    def _wait_for_event(self, method: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self._events):
                if event.get("method") == method:
                    return self._events.pop(i)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.ws.settimeout(remaining)
            try:
                self._events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                continue
            finally:
                self.ws.settimeout(self.timeout)

    def _drain(self, seconds: float) -> None:
        """Collect the events of the next ``seconds`` (late requests, late errors)."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self.ws.settimeout(remaining)
            try:
                self._events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                break
        self.ws.settimeout(self.timeout)

    def open(self, url: str, settle: float = 0.5) -> Page:
        """Load ``url``, wait for its load event plus ``settle`` seconds, report problems."""
        self._events.clear()
        result = self.send("Page.navigate", url=url)
        if result.get("errorText"):
            return Page(url, errors=[f"navigation failed: {result['errorText']}"])
        self._wait_for_event("Page.loadEventFired", self.timeout)
        self._drain(settle)
        return self._page_report(url)

    def _page_report(self, url: str) -> Page:
        page = Page(url)
        request_urls = {}
        for event in self._events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Network.requestWillBeSent":
                request_urls[params["requestId"]] = params["request"]["url"]
            about = (params.get("request") or params.get("response") or params.get("entry") or {}).get("url")
            if _is_implicit_favicon(about or request_urls.get(params.get("requestId"), "")):
                continue  # sent by Chromium itself, and only sometimes
            if method == "Network.requestWillBeSent":
                page.requests.append(params["request"]["url"])
            elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
                page.errors.append(f"HTTP {params['response']['status']}: {params['response']['url']}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                page.errors.append(f"request failed ({params.get('errorText')}): "
                                   f"{request_urls.get(params['requestId'], '?')}")
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text")
                page.errors.append(f"uncaught exception: {text}")
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
                page.errors.append(f"console.{params['type']}: {args}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                page.errors.append(f"browser log: {entry['text']} {entry.get('url', '')}".strip())
        return page

    def evaluate(self, expression: str):
        """Evaluate JavaScript in the page (promises awaited) and return its JSON value."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript error: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0):
        """Poll ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout} s: {expression}")
            time.sleep(0.1)

    def screenshot(self, path: Path, full_page: bool = False) -> None:
        """Save a PNG of the visible window (or of the whole page)."""
        result = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(base64.b64decode(result["data"]))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
