"""The runtime: run a function, or a notebook cell, on N ranks, and get one result per rank back.

Read it in the order a call travels:

* :mod:`.run` — :func:`~distlab.runtime.run.run`, what ``distlab.run`` is;
* :mod:`.options` — arguments checked once, the setup steps ranks run, the options file;
* :mod:`.serialize` — the function and its arguments, pickled (notebook functions by value);
* :mod:`.rundir` — the folder through which the notebook and its ranks talk;
* :mod:`.launchers` — what starts the ranks: torchrun here, ``srun`` or ``sbatch`` on a cluster;
* :mod:`.worker` — what every rank runs: join the process group, run the call, report;
* :mod:`.watcher` — the one loop that watches the ranks for every launcher: results,
  errors, deaths, timeouts, and their output (:mod:`.output`);
* :mod:`.processes` — ending every process a run started, and only those;
* :mod:`.errors` — :class:`RankError`, :class:`DistTimeout`, :class:`LaunchError`;
* :mod:`.pool` — warm ranks reused by many calls, and :mod:`.isolation`, what a warm rank
  puts back between calls;
* :mod:`.magic` — ``%%distributed``, a cell on N ranks;
* :mod:`.devices` — which backend and device a rank uses.
"""
