"""The course hub: JupyterHub starts each student's Jupyter server as a Slurm job.

This is the file `make hub` and tests/hub/test_hub.py run, and the one the appendix "JupyterHub on
HPC" shows. A centre copies it and changes the lines marked CENTRE. The demo fills the values
it does not know in advance (ports, paths, the private cluster) from DISTLAB_HUB_* variables;
see hub/README.md.

    jupyterhub -f hub/jupyterhub_config.py        # as root: PAM reads /etc/shadow, and the
                                                  # spawner submits each job as its student
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from course_spawner import PROFILES, CourseSlurmSpawner, squeue_format  # noqa: E402

c = get_config()  # noqa: F821  (defined by JupyterHub when it loads this file)

# -- where the hub listens and keeps its state ------------------------------------------------
# 127.0.0.1 only: a person opens it on this machine (or through an SSH tunnel). CENTRE: the
# service host's name behind your HTTPS front end.
c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ.get('DISTLAB_HUB_PORT', '8000')}"
# The hub's own API, which the servers call back: they run on the compute nodes, so it must be
# reachable from there. The demo's nodes reach this machine at the controller's address on the
# private cluster's bridge (127.0.0.1 only where its nodes share this machine's loopback).
# CENTRE: the service host's cluster-internal address.
hub_api_ip = os.environ.get("DISTLAB_HUB_API_IP", "127.0.0.1")
c.JupyterHub.hub_bind_url = f"http://{hub_api_ip}:{os.environ.get('DISTLAB_HUB_API_PORT', '8081')}"
state = Path(os.environ.get("DISTLAB_HUB_STATE", HERE / "state"))
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
# configurable-http-proxy, pinned in hub/package.json and installed into hub/node_modules.
c.ConfigurableHTTPProxy.command = [str(HERE / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('DISTLAB_HUB_PROXY_API_PORT', '8001')}"

# -- who may log in ---------------------------------------------------------------------------
# PAM (JupyterHub's default authenticator): the students' Unix accounts and passwords, as on
# the cluster's login nodes. Only members of the course's group get in; its instructors'
# group are the hub's admins. CENTRE: your course's groups (or an OAuth authenticator).
course = os.environ.get("DISTLAB_HUB_COURSE", "dlc")
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {f"{course}-students", f"{course}-instructors"}
c.PAMAuthenticator.admin_groups = {f"{course}-instructors"}

# -- each server is a Slurm job of its student ------------------------------------------------
c.JupyterHub.spawner_class = CourseSlurmSpawner
# The course environment (PyTorch, distlab, JupyterLab, batchspawner, nbgitpuller), on a
# filesystem every node mounts. CENTRE: its path on your shared filesystem.
course_env = Path(os.environ.get("DISTLAB_HUB_COURSE_ENV", sys.prefix))
# The Python that runs it on the nodes, as the student: the environment's own, unless its base
# interpreter is private to root (see hub/README.md, "server environment").
server_python = Path(os.environ.get("DISTLAB_HUB_SERVER_PYTHON", course_env / "bin" / "python"))
c.Spawner.cmd = [str(course_env / "bin" / "jupyterhub-singleuser")]
# batchspawner's batchspawner-singleuser, by way of hub/jupyter/course_singleuser.py: the same
# server, without start-up work no student uses (an IRI grammar, a run of node): half the CPU of
# a start, which a class pays all at once when everyone presses Start.
c.CourseSlurmSpawner.batchspawner_singleuser_cmd = f"{server_python} {HERE / 'jupyter' / 'course_singleuser.py'}"
c.Spawner.default_url = "/lab"
c.Spawner.environment = {
    # The job's whole environment (sbatch --export): the course's Python first on PATH, so
    # kernels and the ranks that distlab starts with srun use it on every node.
    "PATH": f"{server_python.parent}:{course_env / 'bin'}:/usr/local/bin:/usr/bin:/bin",
    "SLURM_CONF": os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"),
    # `squeue` in the student's terminal shows whole user names (its default cuts them to 8
    # characters: "dlc-stud" for every student); `squeue --me` lists the student's jobs alone.
    "SQUEUE_FORMAT": os.environ.get("DISTLAB_HUB_SQUEUE_FORMAT", squeue_format()),
    # Jupyter's settings: first the hub's (hub/jupyter: nbgrader's course and exchange, and
    # the instructor-only parts of nbgrader switched off), then the course environment's
    # extensions (nbgitpuller, nbgrader), kernels and JupyterLab's assets.
    "JUPYTER_CONFIG_PATH": f"{HERE / 'jupyter'}:{course_env / 'etc' / 'jupyter'}",
    "DISTLAB_HUB_EXCHANGE": os.environ.get("DISTLAB_HUB_EXCHANGE", "/srv/nbgrader/exchange"),  # CENTRE
    "JUPYTER_PATH": str(course_env / "share" / "jupyter"),
    "JUPYTERLAB_DIR": str(course_env / "share" / "jupyter" / "lab"),
    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",  # compute nodes have no internet
    # JupyterLab warns this many seconds before the job's time limit (hub/jupyter/course_clock.py).
    "DISTLAB_HUB_TIME_WARNING": os.environ.get("DISTLAB_HUB_TIME_WARNING", "300"),
    # How often the server tells the hub it is in use (kernels busy, files saved): the idle
    # culler below reads that, so it must be well under the idle timeout.
    "JUPYTERHUB_ACTIVITY_INTERVAL": os.environ.get("DISTLAB_HUB_ACTIVITY_INTERVAL", "60"),
}
# Compute nodes have no internet, so the course repository the book's launch links name
# (https://github.com/...) is fetched from a mirror inside the centre: git's `insteadOf`
# rewrites the URL for nbgitpuller's clone and pull. CENTRE: your mirror, or nothing if your
# nodes reach GitHub.
if os.environ.get("DISTLAB_HUB_GIT_MIRROR"):
    mirror, public = os.environ["DISTLAB_HUB_GIT_MIRROR"].split()
    c.Spawner.environment.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0=f"url.{mirror}.insteadOf",
                                 GIT_CONFIG_VALUE_0=public)
# Submit, query and cancel as the student (the hub runs as root): squeue shows the student as
# the job's user, and the job runs with the student's files and rights. runuser (util-linux)
# keeps the environment above but for HOME; batchspawner's default, `sudo -E -u {username}`,
# does the same where sudo is installed and configured for it.
c.CourseSlurmSpawner.exec_prefix = "/usr/sbin/runuser -u {username} --"
c.CourseSlurmSpawner.batch_script = (HERE / "slurm-job.sh").read_text()
c.CourseSlurmSpawner.req_partition = os.environ.get("DISTLAB_HUB_PARTITION", "debug")  # CENTRE
c.CourseSlurmSpawner.req_options = os.environ.get("DISTLAB_HUB_SBATCH_OPTIONS", "")  # CENTRE: --account=...
# Where a server listens on its node: the hub's proxy reaches it at its node's address (Slurm's
# NodeAddr, see course_spawner), so not 127.0.0.1, which is the node's own loopback. The demo's
# nodes are namespaces whose only network is the private bridge: 0.0.0.0 there (127.0.0.1 on the
# loopback-only cluster). CENTRE: the nodes' cluster-internal address (or 0.0.0.0 on a private network).
c.CourseSlurmSpawner.listen_ip = os.environ.get("DISTLAB_HUB_SERVER_IP", "127.0.0.1")
c.CourseSlurmSpawner.profiles = PROFILES  # CENTRE: add "--gres=gpu:4" to a profile's options
# How long a job may wait in the queue before the student is told and the job cancelled.
c.CourseSlurmSpawner.queue_timeout = int(os.environ.get("DISTLAB_HUB_QUEUE_TIMEOUT", "120"))
c.Spawner.start_timeout = c.CourseSlurmSpawner.queue_timeout + 60
c.Spawner.http_timeout = 120
# Ask Slurm every 15 s whether the job still runs: a job that hit its --time limit is noticed
# within a minute, and the student is offered a new start.
c.Spawner.poll_interval = 15
c.JupyterHub.last_activity_interval = int(os.environ.get("DISTLAB_HUB_ACTIVITY_INTERVAL", "60"))
# The spawn page shows the job's progress at once (a Slurm job takes longer than JupyterHub's
# default 10 s to start, and it warned "User ... is slow to start" for every spawn).
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}

# -- servers nobody uses are ended --------------------------------------------------------------
# jupyterhub-idle-culler (JupyterHub's standard service) stops a server with no activity for
# DISTLAB_HUB_IDLE_TIMEOUT seconds: no open JupyterLab tab, no kernel at work. Stopping cancels
# the Slurm job, so its cores go back to the queue; the student's files stay, kernels end.
# CENTRE: the timeout your cluster's queue needs (0 switches the culler off).
idle_timeout = int(os.environ.get("DISTLAB_HUB_IDLE_TIMEOUT", "3600"))
if idle_timeout > 0:
    c.JupyterHub.services = [{
        "name": "idle-culler",
        # --url names this hub's API: hub/demo.py ends a culler its hub left behind by it
        "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--url={c.JupyterHub.hub_bind_url}/hub/api",
                    f"--timeout={idle_timeout}", f"--cull-every={max(10, min(300, idle_timeout // 6))}"],
    }]
    c.JupyterHub.load_roles = [{
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }]
c.JupyterHub.log_level = os.environ.get("DISTLAB_HUB_LOG_LEVEL", "INFO")
