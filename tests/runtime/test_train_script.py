"""templates/train.py, the complete training script, run the way its users run it: ``python`` for one
process, ``torchrun`` for two ranks (the Slurm job is tests/runtime/test_slurm.py's).

* Two ranks with DDP train exactly as one process does on the same global batches: the
  samplers split every global batch between the ranks, so the union of the ranks' batches is
  the one process's batch. After 3 AdamW steps at most 1% of the parameters may differ by
  more than 1e-6, the rule of chapter 4's checks (Adam turns a 1e-8 rounding difference on a
  near-zero gradient into a step difference of up to lr). Measured: 0.09% of the parameters
  pass 1e-6 (the largest difference, 3e-5, where Adam divides by a near-zero second moment).
  Checked to fail on purpose: a sampler that gives every rank the same indices (rank=0
  everywhere) moves 90% of them by more than 1e-6.
* A full checkpoint saved by two ranks is continued by one process (the file does not
  depend on the layout).
* FSDP2 with a sharded checkpoint, stopped after one epoch and resumed, ends with the
  weights of an uninterrupted run (the same arithmetic in the same order: equal to 1e-6).
* Rank 0 alone prints, and a checkpoint is complete before ``latest.json`` names it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from process_support import run_in_own_group

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "templates" / "train.py"
QUICK = ["--steps-per-epoch", "3", "--validation-steps", "2", "--global-batch", "16"]


def run_script(folder: Path, *args: str, ranks: int = 1) -> str:
    """Run the script as a user would, in ``folder``; return what it printed."""
    launcher = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                    "--standalone", "--nproc-per-node", str(ranks)]
    done = run_in_own_group([*launcher, str(SCRIPT), *QUICK, *args], 300, cwd=folder)   # torchrun's workers too
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def full_weights(folder: Path, epoch: int) -> dict[str, torch.Tensor]:
    return torch.load(folder / f"epoch-{epoch}" / "full.pt")["model"]


def sharded_weights(folder: Path, epoch: int, scratch: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(folder / f"epoch-{epoch}", scratch)
    return torch.load(scratch)["model"]


@pytest.mark.slow
def test_two_ranks_train_like_one_process_only_rank_zero_prints_and_one_process_resumes(tmp_path):
    one = run_script(tmp_path, "--epochs", "1", "--checkpoint-dir", "one")
    two = run_script(tmp_path, "--epochs", "1", "--checkpoint-dir", "two", ranks=2)
    assert "1 rank(s)" in one and "2 rank(s)" in two and "global batch 16 = 2 x 8" in two
    assert two.count("epoch 0:") == 1, two                     # printed by rank 0 only
    a, b = full_weights(tmp_path / "one", 0), full_weights(tmp_path / "two", 0)
    assert a.keys() == b.keys()
    diff = torch.cat([(a[k] - b[k]).abs().reshape(-1) for k in a])
    assert (diff > 1e-6).double().mean() <= 0.01, f"{(diff > 1e-6).double().mean():.1%} of the parameters differ"
    resumed = run_script(tmp_path, "--epochs", "2", "--checkpoint-dir", "two", "--resume")
    assert "resumed from" in resumed and "1 rank(s)" in resumed and "epoch 1:" in resumed
    assert full_weights(tmp_path / "two", 1).keys() == a.keys()


@pytest.mark.slow
def test_fsdp_sharded_checkpoint_resumes_where_an_uninterrupted_run_would_be(tmp_path):
    straight = run_script(tmp_path, "--epochs", "2", "--strategy", "fsdp", "--checkpoint", "sharded",
                          "--checkpoint-dir", "straight", ranks=2)
    run_script(tmp_path, "--epochs", "1", "--strategy", "fsdp", "--checkpoint", "sharded",
               "--checkpoint-dir", "stopped", ranks=2)
    assert (tmp_path / "stopped" / "latest.json").read_text().startswith('{"epoch": 0')
    resumed = run_script(tmp_path, "--epochs", "2", "--strategy", "fsdp", "--checkpoint", "sharded",
                         "--checkpoint-dir", "stopped", "--resume", ranks=2)
    assert "resumed from" in resumed and "epoch 0:" not in resumed
    last = [line.split(",")[0] for line in straight.splitlines() if line.startswith("epoch 1:")]
    assert last and last[0] in resumed                         # the same training loss, to 4 decimals
    a = sharded_weights(tmp_path / "straight", 1, tmp_path / "a.pt")
    b = sharded_weights(tmp_path / "stopped", 1, tmp_path / "b.pt")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
