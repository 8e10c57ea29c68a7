"""A Jupyter server extension: the book's launch button opens the copy of a notebook that is handed in.

Why it exists. An exercise page's launch button is an nbgitpuller link: it clones the course
repository into ``~/distlab`` and opens ``distlab/notebooks/<slug>/<slug>.ipynb``. nbgrader's
Assignments tab fetches the released assignment into ``~/<slug>/<slug>.ipynb``, and only that
copy is submitted. Both tabs read "<slug>.ipynb": a student who worked in the copy the button
opened handed in the blank fetched one.

What it does. A request for ``/lab/tree/<clone>/notebooks/<slug>/<slug>.ipynb`` (the launch
button's notebook, after nbgitpuller's clone or pull) looks in the course's exchange: if the
instructor has released an assignment ``<slug>``, the student gets it as the Assignments tab's
Fetch gives it (the same nbgrader code, as the student, into the same folder), unless it is
fetched already, and the browser is sent to ``/lab/tree/<slug>/<slug>.ipynb``, the copy that
Submit hands in. Fetching never overwrites: a fetched folder is kept as it is, only a notebook
missing from it is put back (nbgrader's ``replace_missing_files``). Without a released
assignment (a course that hands in another way, or before the release) the clone's notebook
opens, as before. A tab of the clone's notebook that JupyterLab would restore from an earlier
visit is closed first (``course_workspaces``): one tab per notebook, the one handed in.

Loaded through ``jupyter_server_config.py`` beside this file. Extensions load in alphabetical
order of their names, so this route (``course_launch``) is registered before
``course_sessions``'s and JupyterLab's, and wins it for the launch button's notebooks; every
other notebook URL goes on to ``course_sessions``. A redirected request comes back as
``/lab/tree/<slug>/<slug>.ipynb``, where ``course_sessions`` starts its kernel.
"""

from __future__ import annotations

import os
from pathlib import Path

from course_sessions import OpenNotebookWithKernel
from course_workspaces import close_tabs_of
from jupyter_server.utils import url_escape, url_path_join
from tornado import web

# the launch button's notebook: <clone>/notebooks/<slug>/<slug>.ipynb (nbgitpuller's urlpath)
LAUNCHED = r"/(?P<mode>lab)(?P<workspace>)(?P<tree>/tree/[^/]+/notebooks/(?P<slug>[^/]+)/(?P=slug)\.ipynb)"


class OpenTheCopyHandedIn(OpenNotebookWithKernel):
    """The launch button's notebook: redirect to the fetched assignment, if one is released."""

    @web.authenticated
    async def get(self, mode=None, workspace=None, tree=None, slug=None):  # noqa: D401 (tornado's signature)
        handed_in = self.fetched_notebook(slug)
        if handed_in is None:
            return await super().get(mode, workspace, tree)
        # The clone's tab, open since an earlier visit, would be restored beside the copy handed in.
        clone = tree.removeprefix("/tree/")
        if close_tabs_of(self.workspaces_dir(), clone):
            self.log.info("course_launch: closed the tab of %s, which the launch button now opens as %s", clone, handed_in)
        target = url_path_join(self.base_url, "lab", "tree", url_escape(handed_in))
        query = self.request.query
        self.redirect(f"{target}?{query}" if query else target)

    def workspaces_dir(self) -> Path:
        """Where JupyterLab saves this user's workspaces (its LabApp's ``workspaces_dir``)."""
        for app in self.serverapp.extension_manager.extension_apps.get("jupyterlab", ()):
            if getattr(app, "workspaces_dir", None):
                return Path(app.workspaces_dir)
        from jupyterlab.commands import get_workspaces_dir

        return Path(get_workspaces_dir())

    def fetched_notebook(self, slug: str) -> str | None:
        """The path (relative to the server's root) of the student's fetched copy of the
        assignment ``slug``'s notebook, fetching it first if needed; None when the course has
        released no such assignment, or the fetch did not give the notebook."""
        manager = self.settings.get("assignment_list_manager")   # nbgrader's Assignments tab
        if manager is None:
            return None
        root = Path(self.settings["server_root_dir"]).expanduser().resolve()
        # nbgrader's own steps for the Assignments tab's Fetch (its AssignmentList.fetch_assignment),
        # run here, in the server, as the Assignments tab runs them
        from nbgrader.auth import Authenticator
        from nbgrader.coursedir import CourseDirectory
        from nbgrader.exchange import ExchangeError, ExchangeFactory

        # nbgrader fetches into the server's working folder (its Exchange.assignment_dir, '.'):
        # on the hub the job starts in the home (hub/slurm-job.sh), the server's root
        with manager.get_assignment_dir_config() as config:
            config = manager.load_config()
            course = CourseDirectory(config=config).course_id
            factory = ExchangeFactory(config=config)
            lister = factory.List(config=config)
            released = Path(lister.root) / course / "outbound" / slug
            if not course or not released.is_dir():
                return None
            folder = Path(lister.assignment_dir).resolve()
            if lister.path_includes_course:
                folder = folder / course
            notebook = folder / slug / f"{slug}.ipynb"
            if not notebook.is_file():
                config.CourseDirectory.course_id = course
                config.CourseDirectory.assignment_id = slug
                config.ExchangeFetchAssignment.replace_missing_files = True   # never overwrite the student's files
                fetch = factory.FetchAssignment(coursedir=CourseDirectory(config=config),
                                                authenticator=Authenticator(config=config), config=config)
                try:
                    fetch.start()
                except (ExchangeError, OSError) as exc:
                    self.log.warning("course_launch: could not fetch %s for the launch button (%s); "
                                     "opening the course's copy", slug, exc)
                    return None
                self.log.info("course_launch: fetched %s for the launch button", slug)
        if not notebook.is_file() or not notebook.resolve().is_relative_to(root):
            return None
        return os.path.relpath(notebook, root)


def _load_jupyter_server_extension(serverapp) -> None:
    """Register the route for the launch button's notebooks ahead of course_sessions's."""
    route = url_path_join(serverapp.base_url, LAUNCHED)
    serverapp.web_app.add_handlers(".*$", [(route, OpenTheCopyHandedIn, {"name": "lab"})])
