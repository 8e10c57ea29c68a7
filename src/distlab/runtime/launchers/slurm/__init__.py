"""Running ``distlab.run`` on a Slurm cluster: inside an allocation (srun) or as a batch job (sbatch).

On a laptop, ``distlab.run(fn, nprocs=4)`` starts one ``torchrun`` that starts 4 ranks. On a
cluster the ranks are spread over the nodes Slurm gave you, and the recipe is the one every
HPC centre teaches:

1. **One torchrun per node**, started by ``srun --ntasks-per-node=1``. Each torchrun starts
   the ranks of its own node (``--nproc-per-node``) and numbers them.
2. **A rendezvous on the first node.** ``scontrol show hostnames $SLURM_JOB_NODELIST`` lists
   the allocation's nodes; the first one hosts the c10d rendezvous
   (``--rdzv-backend=c10d --rdzv-endpoint=<first node>:<port>``), and every torchrun connects
   to it to learn how many nodes there are and which ranks are whose. Some clusters reach a
   node over the fast network under another name (JSC appends ``i``): that is
   ``hostname_suffix``. The first node is told it is the host (``is_host``), because with a
   suffixed name it cannot recognise itself.
3. **Files on a shared filesystem.** The function, the results and what the ranks print travel
   through the run directory, exactly as on a laptop; it just has to be on a filesystem every
   node sees (``run_root``: home or project directory, never ``/tmp``).

Two launchers use this recipe:

* :class:`SrunJob` (``launcher="srun"``, and what ``"auto"`` picks inside an allocation, e.g.
  a notebook server started by JupyterHub as a Slurm job, or a shell from ``salloc``): runs
  ``srun ... torchrun ...`` as a new job step, right now, on the allocation's nodes.
* :class:`SbatchJob` (``launcher="sbatch"``, from a login node or a JupyterHub server outside
  any allocation): writes a job script, submits it, shows the job's state while it waits
  (pending, running, done), and streams the ranks' output once they run.

Both behave like the local launcher: results in rank order, :class:`~distlab.RankError` when
a rank raises, :class:`~distlab.DistTimeout` when time is up (for a batch job, time in the
queue does not count), and every Slurm job or step we started is cancelled on error,
timeout or Ctrl-C. When Slurm itself ends the job (``scancel``, the ``--time`` limit, a node
failure) the error is a :class:`SlurmJobError` that says so. Success is judged by the result
files, never by Slurm's exit codes, and Slurm's state is read with ``scontrol`` (``sacct``
needs an accounting database that not every cluster, nor our test cluster, has).

Every Slurm command runs with a timeout: when the controller is down, Slurm clients otherwise
block for minutes. Settings (account, partition, modules, ...) come from
:mod:`.config`. ``distlab-slurm script -- train.py`` prints a job
script for a training script of your own, built by the same functions.

The modules, one job each:

* :mod:`.config`: the settings, from ``distlab.toml`` and ``DISTLAB_SLURM_*``;
* :mod:`.commands`: talking to Slurm (every client call with a timeout), nodes, ports;
* :mod:`.script`: the ``srun`` line and the batch job script;
* :mod:`.remote`: what both jobs share: the run directory on a shared filesystem, and
  explaining how Slurm ended the ranks;
* :mod:`.srun` (:class:`SrunJob`) and :mod:`.sbatch` (:class:`SbatchJob`): the two launchers;
* ``__main__``: the command line (``config``, ``script``).
"""
