"""Grading a class on the cluster: one Slurm job per submission, as a job array.

    python -m distlab.grade autograde SLUG --slurm [--partition P] [--max-parallel N]
                                                   [--time MINUTES] [--mem MIB] [--cpus N] [--gres G]

One notebook takes 30-45 s to grade on a 2-core machine, so a class of 300 is three hours;
nbgrader itself grades one notebook after another. Here every student is one task of a
Slurm job array, and each task runs exactly the grader of one machine,
``python -m distlab.grade autograde SLUG --student S`` (kernel, clean room, caps, sandbox),
on whichever node Slurm gives it, inside the task's own limits (``--time``, ``--mem``,
``--cpus-per-task``).

What is graded: every collected submission that does not yet have all its grades in the
gradebook. So a run that was interrupted, or that left failures, is finished by running the
same command again; ``--regrade`` grades everyone anew.

The gradebook must be a database server (``DISTLAB_GRADE_DB_URL``): many nodes write to it at
once, which is what a server is for and what an sqlite file on a shared disk is not. Each
student's grades are one transaction (:class:`distlab.grade.pipeline.nbplugins.SaveAutoGradesAtOnce`),
so a task killed halfway leaves that student "not graded yet", never half-graded.

`submitit <https://github.com/facebookincubator/submitit>`_ does the Slurm work: it writes the
array's batch script, pickles each task's call, submits, reads each task's result back and
cancels. One thing it expects that a small cluster may lack is ``sacct`` (Slurm's accounting
database) to learn how jobs ended; :class:`QueueWatcher` asks ``squeue`` instead, which every
Slurm has (a finished job stays listed for ``MinJobAge``, 300 s by default).

Failures: a task that ends without a complete grade (node failure, cancelled, time or memory
limit, a database that did not answer) is submitted once more; a student whose grading fails
twice is reported by name with the reason and scores 0 on the cells that were not graded.
Ctrl-C cancels every job of the run (``scancel`` by job id) and waits until they have left the
queue.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from distlab.grade import config

ATTEMPTS = 2
"""Times a student's grading is tried: once, and once more if its job died or left no grade."""
POLL_S = 2.0
"""How often the queue is asked about the run's jobs."""
CANCEL_WAIT_S = 120
"""How long Ctrl-C waits for the cancelled jobs to leave the queue."""
_UNFINISHED = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED",
               "UNKNOWN", "READY", "PREEMPTED"}


def grade_student(slug: str, student: str, db_url: str, work: str, extra: list[str]) -> dict:
    """One array task, on a node: grade ``student`` as one machine would; report how it went."""
    env = dict(os.environ, DISTLAB_GRADE_WORK=work, **{config.DB_URL_VARIABLE: db_url})
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "distlab.grade", "autograde", slug, "--student", student, *extra],
                          env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return {"student": student, "code": done.returncode, "seconds": round(time.monotonic() - start, 1),
            "node": os.environ.get("SLURMD_NODENAME", os.uname().nodename),
            "output": (done.stdout + done.stderr)[-6000:]}


def _queue_watcher(delay_s: float):
    """submitit's job watcher, asking ``squeue`` (always there) instead of ``sacct`` (needs accounting)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class QueueWatcher(SlurmInfoWatcher):
        def _make_command(self):
            arrays = sorted({job_id.split("_")[0] for job_id in self._registered - self._finished})
            if not arrays:
                return None
            return ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T|%N", "--jobs=" + ",".join(arrays)]

        def read_info(self, string):
            text = string.decode() if isinstance(string, bytes) else string
            info = {}
            for line in text.splitlines():
                fields = line.strip().split("|")
                if len(fields) == 3:
                    info[fields[0]] = {"JobID": fields[0], "State": fields[1].split()[0], "NodeList": fields[2]}
            for job_id in self._registered - self._finished:
                if job_id not in info and self._info_dict.get(job_id, {}).get("State") in _UNFINISHED - {"UNKNOWN"}:
                    info[job_id] = {"JobID": job_id, "State": "GONE", "NodeList": ""}  # listed before, not now
            return info

    return QueueWatcher(delay_s=delay_s)


def _gradebook_state(db_url: str, slug: str, students: list[str]) -> dict[str, tuple[float, float] | None]:
    """``{student: (score, max score)}`` for those with every grade in the gradebook, else ``None``."""
    from nbgrader.api import Gradebook, MissingEntry

    found = {}
    with Gradebook(db_url) as gb:
        for student in students:
            try:
                submission = gb.find_submission(slug, student)
            except MissingEntry:
                found[student] = None
                continue
            grades = [g for notebook in submission.notebooks for g in notebook.grades]
            complete = grades and all(g.auto_score is not None for g in grades if g.cell.cell_type == "code")
            found[student] = (submission.score, submission.max_score) if complete else None
    return found


def collected_students(slug: str) -> list[str]:
    """Students with a collected submission of ``slug`` (``submitted/<student>/<slug>/``)."""
    submitted = Path(config.work_dir()) / "submitted"
    return sorted(p.name for p in submitted.iterdir() if (p / slug).is_dir()) if submitted.is_dir() else []


SUBMITIT_WARNING = "ignore:pkg_resources is deprecated as an API:UserWarning"
"""A warning filter for the jobs (``PYTHONWARNINGS``): submitit's, not ours to act on."""


class ClusterRun:
    """One ``autograde --slurm``: submit, watch, retry once, report; Ctrl-C cancels it all."""

    def __init__(self, slug: str, students: list[str], slurm: dict, extra: list[str], say):
        import submitit

        self.slug, self.students, self.extra, self.say = slug, students, extra, say
        self.db_url = config.db_url()
        # The pickled calls hold the database URL: the folder is the instructor's alone.
        self.folder = Path(config.work_dir()) / "slurm" / slug
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        self.executor = submitit.SlurmExecutor(folder=self.folder / "%j", max_num_timeout=0)
        params = {"job_name": f"grade-{slug}", "time": slurm["time"], "mem": f"{slurm['mem']}M",
                  "cpus_per_task": slurm["cpus"], "array_parallelism": slurm["max_parallel"],
                  "use_srun": False, "stderr_to_stdout": True,
                  # submitit imports the deprecated pkg_resources in every job: one warning per log
                  "setup": [f"export PYTHONWARNINGS={shlex.quote(SUBMITIT_WARNING)}"]}
        params.update({k: v for k, v in (("partition", slurm.get("partition")), ("gres", slurm.get("gres"))) if v})
        self.executor.update_parameters(**params)
        self.watcher = _queue_watcher(delay_s=POLL_S)
        self.jobs, self.attempts, self.graded, self.failed = {}, Counter(), {}, {}
        self.submitted = []  # every job of the run, retries included

    def _submit(self, students: list[str]) -> None:
        work = config.work_dir()
        with self.executor.batch():
            jobs = [self.executor.submit(grade_student, self.slug, s, self.db_url, work, self.extra) for s in students]
        for student, job in zip(students, jobs):
            job.watcher = self.watcher  # squeue, not sacct
            self.jobs[student] = job
            self.attempts[student] += 1
        self.submitted += jobs

    def _forget_calls(self) -> None:
        """Delete the run's pickled calls: each holds the database URL, password included, and a
        job needs its own only until it starts. The logs and results stay."""
        for job in self.submitted:
            job.paths.submitted_pickle.unlink(missing_ok=True)

    def _why(self, job) -> str:
        """Why a finished job left its student without complete grades."""
        import signal

        from submitit.core.utils import FailedJobError, UncompletedJobError

        state = self._final_state(job)  # CANCELLED, TIMEOUT, NODE_FAIL, GONE...
        try:
            outcome = job.result()
        except UncompletedJobError:
            return f"its job {job.job_id} ended {state} without a result (log: {job.paths.stdout})"
        except FailedJobError as exc:
            return f"its job {job.job_id} failed: {str(exc).strip().splitlines()[-1]}"
        ended = f"its job {job.job_id} ended {state}: " if state not in ("COMPLETED", "UNKNOWN") else ""
        if outcome["code"] < 0:  # Slurm signalled the job (scancel, time limit, node going down)
            return f"{ended}the grader was killed by {signal.Signals(-outcome['code']).name} on {outcome['node']}"
        lines = [line.strip() for line in outcome["output"].splitlines() if line.strip()]
        said = next((line.split("NOT GRADED (scores 0): ", 1)[1] for line in lines
                     if line.startswith("[distlab.grade] ") and "NOT GRADED (scores 0): " in line),
                    None)  # what autograde itself says of a student it could not grade (never a printed line)
        return ended + (said or f"autograde ended with code {outcome['code']} on {outcome['node']}: "
                                f"{lines[-1] if lines else ''}")

    @staticmethod
    def _final_state(job, wait_s: float = 10.0) -> str:
        """The job's state once the queue has settled it. A job whose result is written may still
        show COMPLETING (or even RUNNING) for a while, longer on a busy node, while Slurm ends its
        processes: ask again, for up to ``wait_s`` seconds, until the state is final."""
        deadline = time.monotonic() + wait_s
        state = job.state
        while state in _UNFINISHED - {"UNKNOWN"} and time.monotonic() < deadline:
            time.sleep(0.5)
            state = job.watcher.get_state(job.job_id, mode="force")
        return state

    @staticmethod
    def _where(job) -> str:
        """`` (34.2 s on node-7)``: how long the job graded, and where."""
        try:
            outcome = job.result()
            return f" ({outcome['seconds']:.1f} s on {outcome['node']})"
        except Exception:  # noqa: BLE001 - graded, but its result file is unreadable: say nothing
            return ""

    def _collect(self, bar) -> None:
        finished = [s for s, job in self.jobs.items() if job.done()]
        if not finished:
            return
        state = _gradebook_state(self.db_url, self.slug, finished)
        retry, ended = [], 0
        for student in finished:
            job = self.jobs.pop(student)
            if state[student] is not None:
                score, top = state[student]
                self.graded[student] = score
                bar.write(f"  {student}: {score:g} / {top:g}{self._where(job)}")
                ended += 1
            elif self.attempts[student] < ATTEMPTS:
                bar.write(f"  {student}: not graded ({self._why(job)}); trying once more")
                retry.append(student)
            else:
                self.failed[student] = self._why(job)
                bar.write(f"  {student}: NOT GRADED")
                ended += 1
        if retry:
            self._submit(retry)
        self._progress(bar, redraw=False)
        bar.update(ended)  # redraws the bar once, with the counts of after this collection

    def _progress(self, bar, redraw: bool = True) -> None:
        states = Counter(job.state for job in self.jobs.values())
        bar.set_postfix(done=len(self.graded), failed=len(self.failed), running=states["RUNNING"],
                        pending=len(self.jobs) - states["RUNNING"], refresh=redraw and sys.stdout.isatty())

    def cancel(self) -> None:
        """scancel every job of the run, by id; wait until none is in the queue."""
        jobs = list(self.jobs.values())
        for job in jobs:
            job.cancel(check=False)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline and not all(job.done(force_check=True) for job in jobs):
            time.sleep(POLL_S)

    def run(self) -> int:
        from submitit.core.utils import FailedJobError
        from tqdm import tqdm

        self.say(f"autograde {self.slug} --slurm: {len(self.students)} student{'s' * (len(self.students) != 1)}, "
                 "one job each, gradebook "
                 f"{config.shown_url(self.db_url)}; job logs in {self.folder}")
        start = time.monotonic()
        interrupted, refused = False, None
        # In a terminal the bar redraws in place; in a log file it is a line every half minute.
        with tqdm(total=len(self.students), desc=f"grading {self.slug}", unit="student", file=sys.stdout,
                  dynamic_ncols=True, mininterval=1 if sys.stdout.isatty() else 30) as bar:
            try:
                self._submit(self.students)
                self._progress(bar)
                while self.jobs:
                    time.sleep(POLL_S)
                    self._collect(bar)
                    self._progress(bar)
            except KeyboardInterrupt:
                interrupted = True
            except FailedJobError as exc:  # sbatch said no: asked for more than a node has, a wrong partition...
                refused = (str(exc).strip().splitlines() or ["no reason given"])[-1]
        try:
            return self._report(start, interrupted, refused)
        finally:
            self._forget_calls()

    def _report(self, start: float, interrupted: bool, refused: str | None) -> int:
        """Cancel what is left if the run was cut short; say how it ended; the exit code."""
        if refused:
            self.cancel()
            self.say(f"autograde {self.slug} --slurm: Slurm refused the jobs ({refused}); check --partition, --cpus, "
                     "--mem, --time and --gres against the cluster's nodes (sinfo --Node --long)")
            return 2
        if interrupted:
            self.say(f"autograde {self.slug} --slurm: interrupted: cancelling {len(self.jobs)} jobs")
            self.cancel()
            self.say(f"autograde {self.slug} --slurm: cancelled; the {len(self.graded)} students graded so far keep "
                     f"their grades; run the same command again to grade the other {len(self.students) - len(self.graded)}")
            return 130
        for student, reason in sorted(self.failed.items()):
            self.say(f"autograde {self.slug}: {student} NOT GRADED (scores 0 on the cells not graded), "
                     f"twice: {reason}")
        self.say(f"autograde {self.slug} --slurm: {len(self.graded)} graded, {len(self.failed)} not graded, "
                 f"in {time.monotonic() - start:.1f} s")
        return 1 if self.failed else 0


def add_arguments(parser) -> None:
    """``autograde``'s options for grading on the cluster."""
    group = parser.add_argument_group("on the cluster", "one Slurm job per student (distlab.grade.course.cluster); "
                                      "the gradebook must be a database server (DISTLAB_GRADE_DB_URL)")
    group.add_argument("--slurm", action="store_true", help="grade as a Slurm job array instead of here")
    group.add_argument("--partition", help="Slurm partition (default: the cluster's default)")
    group.add_argument("--max-parallel", type=int, default=32, help="most jobs running at once (default 32)")
    group.add_argument("--time", type=int, default=30, help="minutes per job (default 30)")
    group.add_argument("--mem", type=int, default=8192, help="MiB per job (default 8192)")
    group.add_argument("--cpus", type=int, default=4, help="cores per job (default 4: one per rank)")
    group.add_argument("--gres", help='e.g. "gpu:1" for chapters graded on GPUs')
    group.add_argument("--regrade", action="store_true", help="grade everyone again, not only who is missing")


def options(args) -> dict:
    """What :func:`add_arguments` parsed, for :func:`autograde_on_cluster`."""
    return {k: getattr(args, k) for k in ("partition", "max_parallel", "time", "mem", "cpus", "gres", "regrade")}


def gradebook_is_shared(slug: str, say) -> bool:
    """Is the gradebook a database server? An sqlite file is refused at once, saying why and what to
    do; a server named by a loopback address gets a warning (:func:`~distlab.grade.config.loopback_host`)."""
    url = config.db_url()
    if not url.startswith("sqlite:"):
        host = config.loopback_host(url)
        if host:
            say(f"autograde {slug} --slurm: warning: the gradebook's host {host} is a loopback address: "
                "a job on another node reaches its own machine there, not this one, and cannot write "
                "its scores; name the database server by its address on the cluster's network")
        return True
    say(f"autograde {slug} --slurm: the gradebook is an sqlite file ({url[len('sqlite:///'):]}), which the "
        "jobs on many nodes cannot share; give it a database server: set DISTLAB_GRADE_DB_URL, e.g. "
        "postgresql+psycopg://USER:PASSWORD@HOST:5432/DATABASE, and release the assignment into it "
        "(see the instructor's guide, \"Grading on the cluster\")")
    return False


def autograde_on_cluster(slug: str, students: list[str], slurm: dict, extra: list[str], say) -> int:
    """``autograde SLUG --slurm``: see the module's docstring."""
    url = config.db_url()
    everyone = students or collected_students(slug)
    if not everyone:
        say(f"autograde {slug} --slurm: no collected submission (collect {slug} first)")
        return 1
    state = _gradebook_state(url, slug, everyone)
    todo = everyone if slurm.get("regrade") else [s for s in everyone if state[s] is None]
    if not todo:
        say(f"autograde {slug} --slurm: all {len(everyone)} students are graded (--regrade grades them again)")
        return 0
    if len(todo) < len(everyone):
        say(f"autograde {slug} --slurm: {len(everyone) - len(todo)} of {len(everyone)} students already graded; "
            f"grading the other {len(todo)}")
    return ClusterRun(slug, todo, slurm, extra, say).run()
