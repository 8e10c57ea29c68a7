"""The course corpus as a tokenised, memory-mapped ``datasets`` Arrow dataset.

The text is a public-domain selection of the King James Version that ships with the
repository (``data/kjv/``, see its README). Tokens are bytes, so the vocabulary is 256 and
matches :class:`distlab.models.TinyGPT`; no tokenizer is downloaded.

One *sample* is a window of ``context + 1`` consecutive bytes of one book: the model reads
the first ``context`` bytes and predicts the last ``context`` (each byte's successor).
Windows start every ``context`` bytes, so consecutive windows share one byte and every byte
of the text is a target exactly once.

How the dataset is made is the code a cluster user runs for a corpus of any size:

1. on the *login node* (it has internet), :func:`prepare_on_login_node`: ``load_dataset``
   reads (or downloads) the raw text, ``map`` tokenises it in batches, ``save_to_disk``
   writes Arrow files to shared storage;
2. on the *compute nodes* (no internet), :func:`load_on_compute_node`: offline mode, then
   ``load_from_disk``, which *memory-maps* the Arrow files: nothing is read until a sample is
   used, and ranks on one node share the pages the operating system caches.

:func:`corpus_dataset` does both with a cache folder on this machine; :func:`corpus_windows`
computes the same windows with plain numpy (no ``datasets``), for fast tests.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

CONTEXT = 32
"""TinyGPT's context: a window holds ``CONTEXT + 1`` bytes."""

LINES_PER_BATCH = 1000
"""Lines per ``map`` batch. A window never crosses a batch or a book boundary."""

_REFERENCE = re.compile(r"^(.*?) \d+:\d+ ")   # "Song of Solomon 2:1 I am the rose..." -> book


def corpus_path() -> Path:
    """The corpus text file: ``$DISTLAB_CORPUS`` if set, else ``data/kjv/kjv-selection.txt`` of this repository."""
    if os.environ.get("DISTLAB_CORPUS"):
        return Path(os.environ["DISTLAB_CORPUS"])
    return Path(__file__).resolve().parents[3] / "data" / "kjv" / "kjv-selection.txt"


def cache_dir() -> Path:
    """Where built datasets are kept: ``$DISTLAB_DATA_CACHE``, else ``~/.cache/distlab/datasets``."""
    return Path(os.environ.get("DISTLAB_DATA_CACHE") or Path.home() / ".cache" / "distlab" / "datasets")


# -- tokenising: one function, used by both the datasets path and the numpy path -----------------

def book_of(line: str) -> str:
    """The book a verse line belongs to: ``"Genesis 1:1 In the..."`` -> ``"Genesis"``."""
    match = _REFERENCE.match(line)
    return match.group(1) if match else ""


def windows_from_lines(lines: list[str], context: int = CONTEXT) -> tuple[list[bytes], list[str]]:
    """Cut lines into windows of ``context + 1`` bytes, never mixing two books.

    Consecutive lines of the same book are joined (each keeps its ``\\n``), encoded as bytes
    (the tokens: values 0..255), and cut into windows starting every ``context`` bytes; the
    last incomplete window of each run is dropped. Returns ``(windows, books)``.
    """
    windows, books = [], []
    run_book, run = None, []

    def flush():
        data = "".join(run).encode("utf-8")
        for start in range(0, len(data) - context, context):
            windows.append(data[start:start + context + 1])
            books.append(run_book)

    for line in lines:
        book = book_of(line)
        if book != run_book and run:
            flush()
            run = []
        run_book = book
        run.append(line + "\n")
    if run:
        flush()
    return windows, books


def corpus_windows(context: int = CONTEXT, path: Path | None = None) -> tuple[np.ndarray, list[str]]:
    """All windows as a ``(num_windows, context + 1)`` uint8 array, and each window's book.

    Same rows, in the same order, as :func:`corpus_dataset`, without ``datasets``.
    """
    lines = Path(path or corpus_path()).read_text(encoding="utf-8").splitlines()
    windows, books = [], []
    for start in range(0, len(lines), LINES_PER_BATCH):
        w, b = windows_from_lines(lines[start:start + LINES_PER_BATCH], context)
        windows += w
        books += b
    array = np.frombuffer(b"".join(windows), dtype=np.uint8).reshape(len(windows), context + 1).copy()
    return array, books


# -- the cluster workflow -----------------------------------------------------------------------

def _tokenise_batch(batch: dict, context: int) -> dict:
    """``map`` function: a batch of text lines in, a batch of windows out (a different number of rows)."""
    windows, books = windows_from_lines(batch["text"], context)
    return {"tokens": [list(w) for w in windows], "book": books}


def prepare_on_login_node(data_files, out_dir, context: int = CONTEXT, hf_cache: str | None = None) -> Path:
    """Read raw text files, tokenise them into windows, and save an Arrow dataset to ``out_dir``.

    This is the step that may use the internet (``load_dataset("some/hub-name")`` downloads);
    run it once, where the network is, and write to storage the compute nodes see.
    """
    import datasets
    from datasets import Features, List, Value, load_dataset

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # keep the book's pages quiet
    try:
        raw = load_dataset("text", data_files=[str(f) for f in np.atleast_1d(data_files)], split="train",
                           cache_dir=hf_cache)
        features = Features({"tokens": List(Value("uint8"), length=context + 1), "book": Value("string")})
        windows = raw.map(_tokenise_batch, batched=True, batch_size=LINES_PER_BATCH, remove_columns=["text"],
                          features=features, fn_kwargs={"context": context}, load_from_cache_file=False)
        windows.save_to_disk(str(out_dir))
    finally:
        if bars:
            datasets.enable_progress_bars()
    return Path(out_dir)


def load_on_compute_node(out_dir):
    """Open a dataset saved by :func:`prepare_on_login_node`, never touching the network.

    The two variables make ``datasets`` and ``huggingface_hub`` fail at once instead of
    waiting for a connection that a compute node will never get. ``load_from_disk`` maps the
    Arrow files into memory; ``with_format("torch")`` returns tensors.
    """
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    from datasets import load_from_disk

    return load_from_disk(str(out_dir)).with_format("torch")


def corpus_dataset(context: int = CONTEXT, copies: int = 1):
    """The corpus windows as a memory-mapped Arrow dataset (columns ``tokens``, ``book``), built once.

    ``copies > 1`` repeats the corpus that many times: only for measuring memory with a
    dataset large enough to see (the book's memory-mapping section).
    """
    return load_on_compute_node(dataset_folder(context, copies))


def dataset_folder(context: int = CONTEXT, copies: int = 1) -> Path:
    """The folder holding the saved dataset; the first call builds it (a second or two).

    Later calls, from any process, only find it. The folder name includes a hash of the
    text, so an edited corpus is rebuilt. Building happens in a private temporary folder that
    is renamed into place, so ranks building at the same time never see a half-written dataset.
    """
    text = corpus_path()
    digest = hashlib.sha256(text.read_bytes()).hexdigest()[:12]
    target = cache_dir() / f"kjv-{digest}-ctx{context}-x{copies}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=target.name + ".building-", dir=target.parent))
    try:
        if copies == 1:
            prepare_on_login_node([text], building / "data", context, hf_cache=str(building / "hf-cache"))
        else:
            import datasets
            from datasets import concatenate_datasets, load_from_disk

            one = load_from_disk(str(dataset_folder(context, 1)))
            bars = datasets.is_progress_bar_enabled()
            datasets.disable_progress_bars()
            try:
                concatenate_datasets([one] * copies).save_to_disk(str(building / "data"))
            finally:
                if bars:
                    datasets.enable_progress_bars()
        try:
            os.rename(building / "data", target)
        except OSError:
            if not target.exists():  # another process renamed its copy first: theirs is as good
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def lm_batch(tokens):
    """Windows ``(batch, context + 1)`` of byte tokens -> ``(inputs, targets)`` for TinyGPT, as int64."""
    import torch

    tokens = torch.as_tensor(tokens).long()
    return tokens[:, :-1], tokens[:, 1:]
