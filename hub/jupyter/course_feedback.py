"""A Jupyter server extension: a student's feedback as a page, with its formulas, offline.

Why it exists. nbgrader's Assignments tab fetches the returned feedback into
``<assignment>/feedback/<submission time>/<notebook>.html`` and its "(view feedback)" link only
moves the file browser into that folder. Opened from there, JupyterLab shows the HTML in a
sandbox behind a "Trust HTML" bar, and nbgrader's template loads MathJax from a CDN, which a
compute node (or an offline classroom) cannot reach.

What it adds:

* ``GET <base>/course/feedback/<assignment>/feedback/<time>[/<notebook>.html]``: the feedback
  page itself, as a page of the student's own server (only the server's owner may open it:
  the same authorization as the file browser). A folder with one notebook's feedback
  redirects to it; one with several lists them. The course's JupyterLab plugin
  (``labextensions/distlab-course``) opens this URL when the student clicks "(view feedback)".
* ``GET <base>/course/mathjax/...``: MathJax 3 from the course environment (the copy the book
  serves, ``book/_extra/vendor``). The course's feedback template
  (``grader/templates/distlab_feedback``) loads it from here.

Both pages are served with a Content-Security-Policy (:data:`FEEDBACK_POLICY`): the feedback
holds the student's notebook, and a ``<script>`` in its markdown or an HTML output (or an
``onerror=`` attribute) must not run. The only script allowed is the template's own, by its
hash (read from the template, so the two cannot drift apart), and what it loads (MathJax, by
``'strict-dynamic'``); formulas render, nothing else runs.

Loaded through ``jupyter_server_config.py`` beside this file.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import AuthenticatedFileHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.escape import url_escape

REPO = Path(__file__).resolve().parents[2]
MATHJAX = REPO / "book" / "_extra" / "vendor" / "mathjax-3.2.2"
FEEDBACK_URL = "/course/feedback/"   # the template finds MathJax relative to this (keep them together)
FEEDBACK_FOLDER = re.compile(r"^(?:[^/]+/)*[^/]+/feedback/[^/]+$")
TEMPLATE = REPO / "src" / "distlab" / "grade" / "pipeline" / "templates" / "distlab_feedback" / "index.html.j2"


def template_script_hash() -> str:
    """The CSP source of the feedback template's one inline script (it loads MathJax)."""
    script = re.search(r"<script>(.*?)</script>", TEMPLATE.read_text(), re.S).group(1)
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


FEEDBACK_POLICY = "; ".join([
    "default-src 'none'",
    f"script-src {template_script_hash()} 'strict-dynamic'",   # MathJax's own scripts, loaded by it
    "style-src 'self' 'unsafe-inline'", "font-src 'self' data:", "img-src 'self' data:", "connect-src 'self'",
    "object-src 'none'", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'self'",
])
"""No script of the notebook runs: only the template's (by hash) and MathJax, which it loads."""


class FeedbackPage(JupyterHandler):
    """One submission's feedback folder (redirect or list) or one notebook's feedback page."""

    auth_resource = "contents"

    @web.authenticated
    @authorized
    def get(self, path: str):
        self.set_header("Content-Security-Policy", FEEDBACK_POLICY)
        root = Path(self.settings["server_root_dir"]).expanduser().resolve()
        target = (root / path).resolve()
        if not target.is_relative_to(root):
            raise web.HTTPError(404)
        relative = target.relative_to(root).as_posix()
        if target.is_dir() and FEEDBACK_FOLDER.match(relative):
            pages = sorted(p.name for p in target.glob("*.html"))
            if not pages:
                raise web.HTTPError(404, "no feedback in this folder yet")
            here = self.request.path.rstrip("/")
            if len(pages) == 1:
                return self.redirect(f"{here}/{url_escape(pages[0], plus=False)}")
            links = "".join(f'<li><a href="{html.escape(here)}/{url_escape(p, plus=False)}">{html.escape(p)}</a></li>'
                            for p in pages)
            return self.finish(f"<!DOCTYPE html><title>Feedback</title><h1>Feedback</h1><ul>{links}</ul>")
        if target.is_file() and target.suffix == ".html" and FEEDBACK_FOLDER.match(target.parent.relative_to(root).as_posix()):
            self.set_header("Content-Type", "text/html; charset=utf-8")
            return self.finish(target.read_bytes())
        raise web.HTTPError(404)


def _load_jupyter_server_extension(serverapp) -> None:
    base = serverapp.base_url
    serverapp.web_app.add_handlers(".*$", [
        (url_path_join(base, FEEDBACK_URL, "(.+)"), FeedbackPage),
        (url_path_join(base, "/course/mathjax/(.*)"), AuthenticatedFileHandler, {"path": str(MATHJAX)}),
    ])
