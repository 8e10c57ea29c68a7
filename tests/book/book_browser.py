"""A static web server and a headless Chromium driven by Playwright.

Used by ``tests/book/test_book.py`` to look at the built book the way a reader's browser does.
Playwright (Python) drives Debian's ``chromium`` through ``executable_path``; it never
downloads a browser of its own (``playwright install`` would, and fails offline).

    with serve_directory(site_dir, "/book/") as base_url, Browser() as browser:
        report = browser.open(base_url + "index.html")   # waits for the load event
        assert not report.errors                         # console errors, failed requests
        browser.resize(390)                              # a phone
        browser.screenshot("index.png")
        browser.page.locator("button.primary-toggle:visible").click()  # Playwright itself
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import sync_playwright

# The widths a reader's window has: a phone, a tablet (or half a laptop screen), a desktop.
WIDTHS = {"phone": 390, "tablet": 820, "desktop": 1280}

# Chromium, as root and offline: no sandbox (root), no GPU, and none of the background
# connections to Google's services that this machine's closed network refuses.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-default-apps", "--mute-audio"]


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
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield _BaseURL(f"http://127.0.0.1:{server.server_address[1]}{prefix}", requests)
    finally:
        server.shutdown()
        server.server_close()


class _QuietServer(http.server.ThreadingHTTPServer):
    """A browser that leaves a page hangs up on requests in flight; that is no error."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _BaseURL(str):
    def __new__(cls, url, requests):
        self = super().__new__(cls, url)
        self.requests = requests
        return self


# --- Chromium through Playwright ---------------------------------------------------------------

@dataclass
class PageReport:
    """What happened while one URL loaded (and until the next ``open``)."""

    url: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


def _is_implicit_favicon(url: str) -> bool:
    """Chromium asks every host for /favicon.ico by itself; a site under a sub-path
    cannot answer that, and no page asked for it."""
    return urllib.parse.urlsplit(url).path == "/favicon.ico"


def _where(message) -> str:
    """``url:line`` of a console message, so a report says which resource or script it is."""
    location = message.location or {}
    return f"{location.get('url') or '?'}:{location.get('lineNumber', '?')}"


class Browser:
    """One headless Chromium with one tab (``self.page``, a Playwright page).

    ``open`` a URL and get a report of its errors and requests; ``evaluate`` JavaScript;
    ``resize`` the window to a reader's width; ``screenshot``.
    """

    def __init__(self, width: int = WIDTHS["desktop"], height: int = 900, timeout: float = 30.0):
        self.timeout_ms = timeout * 1000
        self._playwright = sync_playwright().start()
        try:
            self._chromium = self._playwright.chromium.launch(
                executable_path=find_chromium(), headless=True, args=CHROMIUM_ARGS)
            self.page = self._chromium.new_page(viewport={"width": width, "height": height})
        except BaseException:
            self._playwright.stop()
            raise
        self.page.set_default_timeout(self.timeout_ms)
        self._report = PageReport("about:blank")
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda error: self._report.errors.append(f"uncaught exception: {error}"))
        self.page.on("request", self._on_request)
        self.page.on("response", self._on_response)
        self.page.on("requestfailed", self._on_request_failed)

    def _on_console(self, message) -> None:
        if message.type not in ("error", "assert"):
            return
        # Chromium also logs the implicit favicon's 404 as a console error ("Failed to load
        # resource"), located at the favicon's URL: the same non-finding as its response.
        if _is_implicit_favicon((message.location or {}).get("url", "")):
            return
        self._report.errors.append(f"console.{message.type}: {message.text} (at {_where(message)})")

    def _on_request(self, request) -> None:
        if not _is_implicit_favicon(request.url):
            self._report.requests.append(request.url)

    def _on_response(self, response) -> None:
        if response.status >= 400 and not _is_implicit_favicon(response.url):
            self._report.errors.append(f"HTTP {response.status}: {response.url}")

    def _on_request_failed(self, request) -> None:
        failure = request.failure or ""
        if "ERR_ABORTED" not in failure and not _is_implicit_favicon(request.url):
            self._report.errors.append(f"request failed ({failure}): {request.url}")

    def open(self, url: str, settle: float = 0.5) -> PageReport:
        """Load ``url``, wait for its load event plus ``settle`` seconds, report problems."""
        self._report = PageReport(url)
        try:
            self.page.goto(url, wait_until="load")
        except Exception as error:  # noqa: BLE001 (a navigation error is a finding, not a crash)
            self._report.errors.append(f"navigation failed: {error}")
            return self._report
        self.page.wait_for_timeout(settle * 1000)
        return self._report

    def resize(self, width: int, height: int = 900) -> None:
        """Give the window a reader's width; the page lays itself out again."""
        self.page.set_viewport_size({"width": width, "height": height})
        self.page.wait_for_timeout(150)

    def evaluate(self, expression: str):
        """Evaluate JavaScript in the page (promises awaited) and return its JSON value."""
        return self.page.evaluate(expression)

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
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=full_page)

    def close(self) -> None:
        """End Chromium and Playwright's driver (both are this test's own children)."""
        with contextlib.suppress(Exception):
            self._chromium.close()
        self._playwright.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
