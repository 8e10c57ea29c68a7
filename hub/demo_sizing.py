"""How big the demo's private Slurm cluster must be for every student of a class to hold a server.

Part of the demo course (hub/demo.py, ``make hub STUDENTS=N``): the class's servers are Slurm jobs
of the spawn form's default profile (hub/course_spawner.py), dealt out to the cluster's nodes
whole. tests/hub/test_hub.py checks the count for classes of every size up to 60.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
sys.path.insert(0, str(HERE))
import slurm_cluster  # noqa: E402
from course_spawner import PROFILES  # noqa: E402


def cpus_per_node_for(students: int) -> int | None:
    """CPUs each node of the private cluster must declare so that every student's server fits
    with the default profile at once; None when this machine's own cores already suffice.

    More than the machine has is declared on purpose (Slurm allows it for testing: see
    ``scripts/slurm_cluster.py``, ``DISTLAB_CLUSTER_CPUS_PER_NODE``): the servers then share the
    real cores, which idle notebooks mostly leave free.
    """
    per_node = cpus_per_node_needed(students, next(iter(PROFILES.values())), len(slurm_cluster.NODES))
    return per_node if per_node > (os.cpu_count() or 1) else None


def cpus_per_node_needed(students: int, profile: dict, nodes: int) -> int:
    """CPUs per node for ``students`` jobs of ``profile`` to run at once on ``nodes`` nodes.

    A job takes ``tasks_per_node * cpus_per_task`` cores on each of its nodes, and a node holds
    whole jobs only: spare cores split across the nodes help nobody. Counting cores for the
    class as a whole (``students * cores / nodes``) gave a class of 3 on two nodes 3 CPUs a
    node: two 2-core servers ran, each node had 1 core left, and the third student's server
    fitted on neither. So the class's jobs are dealt out whole, ``ceil(students * profile's
    nodes / nodes)`` to a node, and each node gets the cores of that many.
    """
    jobs_per_node = -(-students * int(profile["nodes"]) // nodes)
    return jobs_per_node * int(profile["tasks_per_node"]) * int(profile["cpus_per_task"])
