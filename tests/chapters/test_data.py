"""Chapter 1's reference code: the corpus dataset, the distributed sampler, the three sharding strategies.

Every distributed result is compared with the single-process one. Token batches are integers,
so they must match exactly; gradients are float32 sums in another order, so they are compared
with ``checks.assert_gradients_match`` (its tolerance is justified in ``distlab.grade.checks``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.distributed as dist

import distlab
from distlab import models
from distlab.data import corpus, measure, sharding
from distlab.grade import checks


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    """A private dataset cache for this module (ranks started after this inherit it)."""
    folder = tmp_path_factory.mktemp("data-cache")
    old = os.environ.get("DISTLAB_DATA_CACHE")
    os.environ["DISTLAB_DATA_CACHE"] = str(folder)
    yield folder
    if old is None:
        del os.environ["DISTLAB_DATA_CACHE"]
    else:
        os.environ["DISTLAB_DATA_CACHE"] = old


@pytest.fixture(scope="module")
def pools(data_cache, pools):
    """conftest's warm ranks, started once the ranks' data cache is set (they read it from the environment)."""
    yield


# -- the corpus -----------------------------------------------------------------------------------

def test_corpus_ships_with_its_license_and_is_plain_ascii():
    path = corpus.corpus_path()
    assert path.exists() and (path.parent / "README.md").exists()
    assert "public domain" in (path.parent / "README.md").read_text()
    data = path.read_bytes()
    assert 1_000_000 < len(data) < 2_000_000
    assert max(data) < 128


def test_windows_are_bytes_of_one_book_overlapping_by_one():
    windows, books = corpus.corpus_windows()
    assert windows.dtype == np.uint8 and windows.shape[1] == corpus.CONTEXT + 1
    text = corpus.corpus_path().read_bytes()
    first = bytes(windows[0])
    assert text.startswith(first) and first.startswith(b"Genesis 1:1 In the beginning")
    # within a run of one book, window i+1 starts where window i ends (targets cover every byte once)
    same = [i for i in range(len(books) - 1) if books[i] == books[i + 1]]
    chained = sum(windows[i, -1] == windows[i + 1, 0] for i in same)
    assert chained >= 0.99 * len(same)   # the rest: a new batch of 1000 lines starts a new run
    assert len(set(books)) == 14 and books[0] == "Genesis" and books[-1] == "Revelation"
    for i in range(0, len(windows), 997):     # every window is a piece of the text
        assert bytes(windows[i]) in text


def test_arrow_dataset_equals_the_numpy_windows_and_is_memory_mapped(data_cache):
    windows, books = corpus.corpus_windows()
    dataset = corpus.corpus_dataset()
    assert len(dataset) == len(windows)
    assert torch.equal(dataset[:]["tokens"], torch.from_numpy(windows).long())
    assert dataset[:]["book"] == books
    assert all(f["filename"].startswith(str(data_cache)) for f in dataset.cache_files)  # on disk, mapped
    inputs, targets = corpus.lm_batch(dataset[0:8]["tokens"])
    assert inputs.shape == targets.shape == (8, corpus.CONTEXT) and inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    copies = corpus.corpus_dataset(copies=3)
    assert len(copies) == 3 * len(windows)
    assert torch.equal(copies[len(windows) + 5]["tokens"], dataset[5]["tokens"])
    loss = models.loss_fn(models.build("gpt"), (inputs, targets))
    assert abs(loss.item() - np.log(256)) < 0.5   # an untrained byte model: about ln(256)


OFFLINE_SCRIPT = textwrap.dedent("""
    import os, sys, numpy as np
    from distlab.data import corpus
    login, out = sys.argv[1], sys.argv[2]
    # on the login node (here: the shipped text file stands in for a download)
    corpus.prepare_on_login_node([corpus.corpus_path()], out, hf_cache=login)
    # on a compute node: offline, from the saved Arrow files
    dataset = corpus.load_on_compute_node(out)
    windows, _ = corpus.corpus_windows()
    assert np.array_equal(dataset[:]["tokens"].numpy(), windows)
    from datasets import load_dataset
    lines = load_dataset("text", data_files=str(corpus.corpus_path()), split="train", cache_dir=login)
    assert lines[0]["text"].startswith("Genesis 1:1")
    try:
        load_dataset("distlab-no-such-org/no-such-dataset")
    except Exception as error:
        print("refused:", type(error).__name__, error)
    else:
        raise SystemExit("offline mode did not refuse a hub download")
    print("offline ok", len(dataset))
""")


def test_the_cluster_workflow_runs_offline(tmp_path):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-c", OFFLINE_SCRIPT, str(tmp_path / "login"), str(tmp_path / "saved")],
                          env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "offline ok 41415" in proc.stdout
    assert "refused:" in proc.stdout and "offline" in proc.stdout.lower()


# -- the distributed sampler -------------------------------------------------------------------------

@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_sampler_gives_torchs_indices(drop_last, shuffle):
    from torch.utils.data import DistributedSampler as TorchSampler

    for n in (1, 5, 7, 10, 13, 100):
        for world in (1, 2, 3, 4):
            if drop_last and n < world:
                continue
            for epoch in range(3):
                for rank in range(world):
                    ours = sharding.DistributedSampler(n, world, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
                    theirs = TorchSampler(range(n), world, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
                    ours.set_epoch(epoch)
                    theirs.set_epoch(epoch)
                    assert list(ours) == list(theirs) and len(ours) == len(theirs), (n, world, rank, epoch)


@pytest.mark.parametrize("n,world", [(10, 2), (13, 4), (7, 4), (3, 4), (100, 3)])
def test_sampler_shards_are_disjoint_complete_and_equal(n, world):
    for drop_last in (False, True):
        if drop_last and n < world:
            continue
        shards = []
        for rank in range(world):
            sampler = sharding.DistributedSampler(n, world, rank, drop_last=drop_last)
            sampler.set_epoch(3)
            shards.append(list(sampler))
        assert len({len(s) for s in shards}) == 1
        together = [i for s in shards for i in s]
        if drop_last:
            assert len(set(together)) == len(together) == world * (n // world)   # disjoint, tail cut
        else:
            assert set(together) == set(range(n))                                 # complete
            assert len(together) - n == (-n) % world                              # only the padding repeats


def test_without_set_epoch_every_epoch_repeats_the_same_order():
    forgetful = sharding.DistributedSampler(1000, 4, 1)
    careful = sharding.DistributedSampler(1000, 4, 1)
    orders_forgetful, orders_careful = [], []
    for epoch in range(3):
        careful.set_epoch(epoch)
        orders_forgetful.append(list(forgetful))
        orders_careful.append(list(careful))
    assert orders_forgetful[0] == orders_forgetful[1] == orders_forgetful[2]
    assert len({tuple(o) for o in orders_careful}) == 3
    # determinism: the same epoch gives the same order in a new sampler
    again = sharding.DistributedSampler(1000, 4, 1)
    again.set_epoch(2)
    assert list(again) == orders_careful[2]


# -- global batches and weighted sampling ---------------------------------------------------------------

def test_global_batches_are_a_permutation_per_epoch():
    b0 = sharding.global_batches(103, 10, seed=1, epoch=0)
    b1 = sharding.global_batches(103, 10, seed=1, epoch=1)
    assert b0.shape == (10, 10)
    assert len(set(b0.reshape(-1).tolist())) == 100 and not torch.equal(b0, b1)
    assert torch.equal(b0, sharding.global_batches(103, 10, seed=1, epoch=0))


def test_temperature_weights_flatten_the_mixture():
    sources = ["big"] * 900 + ["small"] * 100
    natural = sharding.temperature_weights(sources, 1.0)
    assert torch.allclose(natural, torch.full((1000,), 1e-3, dtype=torch.float64))   # T=1: every sample alike
    flat = sharding.temperature_weights(sources, 1e9)
    assert abs(flat[:900].sum().item() - 0.5) < 1e-6 and abs(flat[900:].sum().item() - 0.5) < 1e-6
    t2 = sharding.temperature_weights(sources, 2.0)            # 30 : 10 -> 0.75 : 0.25
    assert abs(t2[:900].sum().item() - 0.75) < 1e-9
    draws = sharding.global_batches(1000, 100, seed=0, weights=flat).reshape(-1)
    small_share = (draws >= 900).double().mean().item()
    assert 0.45 < small_share < 0.55   # 1000 draws: standard deviation 0.016


# -- the three strategies on 2 and 4 ranks ----------------------------------------------------------------

def all_strategies(per_rank_batch, steps, seed):
    """On each rank: {strategy: this rank's batches}, plus the bytes each strategy sent."""
    from distlab.tools import comm

    dataset = corpus.corpus_dataset()
    batches = sharding.global_batches(len(dataset), per_rank_batch * dist.get_world_size(), seed=seed)[:steps]
    out, sent = {}, {}
    for strategy in measure.STRATEGIES:
        with comm.record() as log:
            out[strategy] = list(measure.strategy_batches(strategy, dataset, batches, measure.DEFAULT_SOURCE[strategy]))
        sent[strategy] = log.bytes_sent()
    return out, sent


@pytest.mark.parametrize("nprocs", [2, 4])
def test_every_strategy_delivers_the_global_batch_split_over_ranks(pools, nprocs):
    per_rank, steps, seed = 3, 5, 11
    results = distlab.run(all_strategies, per_rank, steps, seed, nprocs=nprocs, timeout=120)
    dataset = corpus.corpus_dataset()
    expected = sharding.global_batches(len(dataset), per_rank * nprocs, seed=seed)[:steps]
    width = corpus.CONTEXT + 1
    for strategy in measure.STRATEGIES:
        for step in range(steps):
            pieces = [results[rank][0][strategy][step] for rank in range(nprocs)]
            assert all(p.shape == (per_rank, width) and p.dtype == torch.uint8 for p in pieces), strategy
            reference = dataset[expected[step].tolist()]["tokens"].to(torch.uint8)
            assert torch.equal(torch.cat(pieces), reference), (strategy, step)
    sent = [results[rank][1] for rank in range(nprocs)]
    assert all(s["iterable"] == 0 and s["batch-sampler"] == 0 for s in sent)
    assert sent[0]["dispatch"] == steps * (nprocs - 1) * per_rank * width        # rank 0 scatters the rest
    assert all(s["dispatch"] == 0 for s in sent[1:])


def sampler_shards(n, drop_last, epochs):
    sampler = sharding.DistributedSampler(n, dist.get_world_size(), dist.get_rank(), seed=5, drop_last=drop_last)
    shards = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


@pytest.mark.parametrize("nprocs", [2, 4])
def test_sampler_on_ranks_covers_each_epoch(pools, nprocs):
    for n in (9, 37):
        per_rank = distlab.run(sampler_shards, n, False, 3, nprocs=nprocs)
        for epoch in range(3):
            together = [i for rank in range(nprocs) for i in per_rank[rank][epoch]]
            assert set(together) == set(range(n)) and len(together) == nprocs * -(-n // nprocs)
        assert per_rank[0][0] != per_rank[0][1]


def data_parallel_gradients(per_rank_batch, seed):
    """Batch-sampler sharding feeding one data-parallel step: the averaged gradients on this rank."""
    dataset = corpus.corpus_dataset()
    world, rank = dist.get_world_size(), dist.get_rank()
    batches = sharding.global_batches(len(dataset), per_rank_batch * world, seed=seed)[:1]
    indices = next(iter(sharding.BatchSamplerShard(batches, rank, world)))
    model = models.build("gpt")
    models.loss_fn(model, corpus.lm_batch(dataset[indices]["tokens"])).backward()
    grads = {}
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        grads[name] = p.grad
    return grads


@pytest.mark.parametrize("nprocs", [2, 4])
def test_batch_sampler_sharding_gives_the_gradients_of_the_global_batch(pools, nprocs):
    per_rank, seed = 4, 3
    grads = distlab.run(data_parallel_gradients, per_rank, seed, nprocs=nprocs)
    dataset = corpus.corpus_dataset()
    batch = sharding.global_batches(len(dataset), per_rank * nprocs, seed=seed)[0].tolist()
    reference = models.reference_gradients(models.build("gpt"), corpus.lm_batch(dataset[batch]["tokens"]))
    checks.assert_gradients_match(grads, reference)


def test_measure_strategy_reports_memory_and_traffic(pools):
    results = {s: distlab.run(measure.measure_strategy, s, 8, 10, nprocs=2) for s in measure.STRATEGIES}
    for ranks in results.values():
        assert all(r["samples_per_s"] > 0 and r["peak"] > 0 for r in ranks)
        assert ranks[0]["checksum"] == results["iterable"][0]["checksum"]   # same tokens, whatever the strategy
    assert results["dispatch"][0]["bytes_sent"] == 10 * 8 * (corpus.CONTEXT + 1)
