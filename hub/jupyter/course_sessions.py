"""A Jupyter server extension: a notebook opened by its URL has its kernel before the page loads.

Why it exists. A student follows the book's launch link; nbgitpuller clones the course and
sends the browser to ``/lab/tree/<notebook>.ipynb``. JupyterLab then starts the notebook's
kernel by itself, but only if it holds the server's kernel specs at that moment
(``SessionContext.startKernel``: ``getDefaultKernel`` returns null without them). It asks for
them once while the page loads (``GET /api/kernelspecs``); when that one request fails (a busy
node, a proxy that drops it) its spec manager keeps none until its next poll a minute later,
and the notebook opens with a "Select Kernel" dialog whose preselected answer is "No Kernel".
Seen on the course hub under load; tests/hub/test_course_sessions.py reproduces it (a slow answer
does not: JupyterLab 4.6 waits for it).

What it does. A request for ``/lab/tree/<path>.ipynb`` first makes sure a session exists for
that notebook (the kernel its metadata names, or the server's default kernel if that one is
not installed here), then renders JupyterLab's page as usual. JupyterLab, opening the
notebook, finds the session among the running ones and connects to it: it never needs the
spec list, so it never asks. The kernel also starts while the page loads, not after.

Loaded through ``jupyter_server_config.py`` beside this file. Extensions are loaded in
alphabetical order of their names (jupyter_server's ``ExtensionManager.sorted_extensions``), so
this one's route is registered before JupyterLab's own ``/lab/tree/...`` route and wins it.
"""

from __future__ import annotations

import asyncio

from jupyter_server.utils import ensure_async, url_path_join
from jupyterlab_server.handlers import LabHandler
from tornado import web

NOTEBOOK_URL = r"/(?P<mode>lab)(?P<workspace>)(?P<tree>/tree/.+\.ipynb)"


class OpenNotebookWithKernel(LabHandler):
    """JupyterLab's page handler, which first gives the notebook in the URL its session."""

    _starting: dict[str, asyncio.Lock] = {}

    @web.authenticated
    async def get(self, mode=None, workspace=None, tree=None):  # noqa: D401 (tornado's signature)
        path = tree.removeprefix("/tree/")
        await self.ensure_session(path)
        return super().get(mode, None, tree)

    async def ensure_session(self, path: str) -> None:
        """Start the notebook's kernel in a session of its own, unless one is running already.

        A path that is no notebook the server can read (missing, not JSON, outside its root)
        starts nothing, and neither does a user the server's authorizer does not allow to run
        kernels: JupyterLab's page then behaves as it always does.
        """
        # only what the sessions API would let this user do (a server's authorizer may allow a
        # visitor to read but not to run)
        if not await ensure_async(self.authorizer.is_authorized(self, self.current_user, "execute", "kernels")):
            return
        lock = self._starting.setdefault(path, asyncio.Lock())  # two tabs opening at once: one session
        async with lock:
            sessions = self.session_manager
            if await sessions.session_exists(path=path):
                return
            try:
                model = await ensure_async(self.contents_manager.get(path, content=True, type="notebook"))
            except Exception:  # noqa: BLE001 (any failure to read it: leave it to JupyterLab)
                return
            wanted = ((model.get("content") or {}).get("metadata") or {}).get("kernelspec", {}).get("name")
            installed = self.kernel_spec_manager.find_kernel_specs()
            kernel = wanted if wanted in installed else self.kernel_manager.default_kernel_name
            name = path.rsplit("/", 1)[-1]
            await sessions.create_session(path=path, name=name, type="notebook", kernel_name=kernel)
            self.log.info("course_sessions: started kernel %r for %s before JupyterLab asked", kernel, path)


def _load_jupyter_server_extension(serverapp) -> None:
    """Register the route for notebook URLs (``/lab/tree/...ipynb``) ahead of JupyterLab's."""
    route = url_path_join(serverapp.base_url, NOTEBOOK_URL)
    serverapp.web_app.add_handlers(".*$", [(route, OpenNotebookWithKernel, {"name": "lab"})])
