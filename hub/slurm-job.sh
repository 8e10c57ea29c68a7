#!/bin/bash
# The Slurm job that runs one student's Jupyter server. batchspawner fills in the fields in
# double braces (the spawner's req_* settings and the profile the student picked) and submits
# the script with `sbatch` as the student. The job's log goes to a hidden folder of the home
# (~/.jupyterhub-slurm/<job id>.log, made by the spawner's submit command): not the first thing
# the student's file browser shows, still there to read when a server misbehaves.
#SBATCH --job-name=jupyterhub
#SBATCH --output={{homedir}}/.jupyterhub-slurm/%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --partition={{partition}}
#SBATCH --time={{runtime}}
#SBATCH --nodes={{nodes}}
#SBATCH --ntasks-per-node={{tasks_per_node}}
#SBATCH --cpus-per-task={{cpus_per_task}}
{% if options %}#SBATCH {{options}}
{% endif %}{% if profile_options %}#SBATCH {{profile_options}}
{% endif %}
set -euo pipefail
echo "course server of $USER: Slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST ($SLURM_NTASKS tasks)"
{{prologue}}
# The server runs in the job's batch step, not in an `srun` step of its own: a step would hold
# the allocation's cores, and the ranks that `distlab.run` starts with `srun` need them.
{{cmd}}
