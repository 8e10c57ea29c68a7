"""The chapters of the course, in one place: what each one is called, where its pages, its
reference code and its exercise live, which reference code its graded tasks must not see
printed, and how the places that list every chapter describe it.

Everything that used to keep its own list of chapters reads this one instead: the warm ranks
import every chapter's package before a call (:data:`distlab.runtime.isolation.PRELOADED`), the
book's tests look for the graded references in the rendered pages, and the three places that
name every chapter in prose (the chapter map of :mod:`distlab`, the README's table and the
reading path of ``book/intro.md``) are written from this list by
``python -m distlab.grade chapter-rows --write``; ``tests/chapters/test_chapters.py`` fails, saying that
command, when one of them differs from what the list gives. Adding a chapter is one entry here
and its line in ``_toc.yml`` (``python -m distlab.grade new-chapter`` writes both, the
chapter's own files, and the three places again).

An entry says:

* ``slug``: ``NN-name``, the name of the chapter's folders (``book/``, ``solutions/``,
  ``notebooks/``); ``NN`` is the chapter's number.
* ``title``: the chapter's name, as every list of chapters shows it (its case kept).
* ``package``: its reference code, e.g. ``distlab.data_parallel`` (``None`` for the first
  steps, which use the runtime itself).
* ``graded``: the reference code of its graded tasks, as ``"module:name"``. The book may call
  these, never print them (a student would copy the answer from the page).
* ``page``: the chapter's opening page (a docname of ``_toc.yml``); its other pages are in the
  same folder.
* ``exercise``: whether it has an exercise, ``solutions/<slug>/<slug>.ipynb``.
* ``about``: what the chapter is about, one sentence (MyST, ``{term}`` links allowed), after
  the chapter's title in the reading path of ``book/intro.md``.
* ``uses``: what its pages and exercise use from its package, as Markdown (names in
  backquotes, relative to the package); the README's table and the chapter map show it.

This module imports nothing: the runtime reads it on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chapter:
    slug: str
    title: str
    package: str | None
    graded: tuple[str, ...] = ()
    page: str = ""
    exercise: bool = True
    about: str = ""
    uses: str = ""

    @property
    def number(self) -> int:
        return int(self.slug[:2])

    @property
    def folder(self) -> str:
        """The folder of the chapter's pages, e.g. ``book/03-ddp``."""
        return self.page.rpartition("/")[0]


CHAPTERS = (
    Chapter("00-first-steps", "First steps", None, (), "book/getting-started/first-steps",
            about=("your first distributed program, which runs code on 1, 2 and 4 ranks and shows "
                   "what {term}`data parallelism` does to a batch."),
            uses=("`distlab.run`, `distlab.Pool`, `%%distributed`, `distlab.RankError`; launchers "
                  "(torchrun, srun, sbatch)")),
    Chapter("01-data-loading", "Data loading", "distlab.data",
            ("distlab.data.sharding:DistributedSampler", "distlab.data.sharding:global_batches",
             "distlab.data.sharding:rank_slice", "distlab.data.sharding:BatchSamplerShard"),
            "book/01-data-loading/index",
            about=("giving every {term}`rank` its own share of the data, three ways of doing it, and "
                   "what each costs in memory and speed."),
            uses="`corpus_dataset`, `sharding` (`DistributedSampler`, the three strategies), `measure`"),
    Chapter("02-collectives", "Collectives", "distlab.collectives",
            ("distlab.collectives.all_reduce:ring_reduce_scatter", "distlab.collectives.all_reduce:ring_all_gather",
             "distlab.collectives.all_reduce:ring_all_reduce"),
            "book/02-collectives/index",
            about="point-to-point messages and every collective, with a cost model that predicts their time.",
            uses=("`all_reduce` (naive, tree, ring = reduce-scatter + all-gather), `faster_ring` (the"
                  " ring without temporaries, optionally in pipelined segments), `cost_model` (α-β)")),
    Chapter("03-ddp", "Data parallelism", "distlab.data_parallel",
            ("distlab.data_parallel.naive:broadcast_parameters", "distlab.data_parallel.naive:naive_step",
             "distlab.data_parallel.overlap:OverlappedDDP", "distlab.data_parallel.overlap:accumulation_step"),
            "book/03-ddp/index",
            about=("DDP from scratch, {term}`gradient accumulation`, and the same loss curve on one "
                   "and on many ranks."),
            uses="`naive`, `buckets`, `overlap` (`OverlappedDDP`, `no_sync` and accumulation)"),
    Chapter("04-zero-fsdp", "ZeRO and FSDP", "distlab.zero",
            ("distlab.zero.optimizer:ShardedOptimizer", "distlab.zero.flat:WhenGradientsReady",
             "distlab.zero.flat:reduce_scatter_into", "distlab.zero.fully_shard:FullyShardedModel"),
            "book/04-zero-fsdp/index",
            about=("where a training step's memory goes, and how sharding it lets a model that fits "
                   "on no single device train on several."),
            uses=("`theory` (bytes per stage), `flat`, `stages`, `optimizer` (`ShardedOptimizer`: "
                  "ZeRO-1/2), `fully_shard` (`FullyShardedModel`: ZeRO-3), `fsdp2` (`fully_shard`, torch's "
                  "per-parameter form), `checkpointing`")),
    Chapter("05-tensor-parallel", "Tensor parallelism", "distlab.tensor_parallel",
            ("distlab.tensor_parallel.regions:copy_to_parallel_region",
             "distlab.tensor_parallel.regions:reduce_from_parallel_region",
             "distlab.tensor_parallel.layers:ColumnParallelLinear", "distlab.tensor_parallel.layers:RowParallelLinear",
             "distlab.tensor_parallel.model:ParallelMLP", "distlab.tensor_parallel.model:ParallelBlock",
             "distlab.tensor_parallel.layers:vocab_parallel_cross_entropy"),
            "book/05-tensor-parallel/index",
            about="splitting the matrices inside a layer.",
            uses="`regions` (f and g), `layers`, `model` (Megatron GPT, sequence parallel), `dtensor`, `experts`"),
    Chapter("06-pipeline", "Pipeline parallelism", "distlab.pipeline_parallel",
            ("distlab.pipeline_parallel.executor:Executor", "distlab.pipeline_parallel.schedules:gpipe",
             "distlab.pipeline_parallel.schedules:one_f_one_b", "distlab.pipeline_parallel.timeline:bubble_fraction"),
            "book/06-pipeline/index",
            about="splitting the layers, and the schedules that keep every stage busy.",
            uses=("`stages`, `schedules` (GPipe, 1F1B, interleaved, ZB-H1), `timeline` (simulate, "
                  "bubble), `measured_model` (the bubble with message costs), `executor`, `training`")),
    Chapter("07-3d-parallelism", "3D parallelism", "distlab.parallel3d",
            ("distlab.parallel3d.mesh:ProcessGrid", "distlab.parallel3d.train:forward_backward",
             "distlab.parallel3d.train:average_gradients"),
            "book/07-3d-parallelism/index",
            about="combining all of the above and choosing a layout.",
            uses=("`mesh` (`Grid`, the rank grid), `train`, `torch_train`, `planner` (choosing a "
                  "layout), `recommend`")),
    Chapter("08-context-parallel", "Context parallelism", "distlab.context_parallel",
            ("distlab.context_parallel.reference:merge_partials",
             "distlab.context_parallel.reference:balanced_ring_attention"),
            "book/08-context-parallel/index",
            about=("splitting a long sequence across ranks, and attention over its pieces: {term}`ring attention`, "
                   "its causal balance, Ulysses."),
            uses=("`blockwise` (attention by blocks, the exact merge), `layout`, `ring` (ring attention, forward "
                  "and backward, its bytes), `balance` (the balanced causal layout), `ulysses`, `torch_native`, "
                  "`model` (a model with attention split by sequence), `timeline` (the ring's measured steps), "
                  "`reference` (the exercise's tasks)")),
    # new-chapter adds its entry above this line
)


def by_slug(slug: str) -> Chapter:
    for chapter in CHAPTERS:
        if chapter.slug == slug:
            return chapter
    raise KeyError(f"no chapter {slug!r}; the chapters are {[c.slug for c in CHAPTERS]}")


def packages() -> list[str]:
    """Every chapter's reference package, in chapter order."""
    return [c.package for c in CHAPTERS if c.package]
