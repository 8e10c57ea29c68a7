"""Chapter 5: tensor parallelism from scratch: split every big matrix of the model across ``N`` ranks.

Data parallelism (chapters 3-4) gives every rank a different slice of the *batch*. Tensor
parallelism gives every rank a different slice of each *weight matrix*, and every rank sees
the whole batch. It is what makes a layer that does not fit on one GPU possible, and it is
the "TP" of 3D parallelism (Shoeybi et al., 2019, "Megatron-LM").

A linear layer ``y = x @ W.T + b`` with ``W`` of shape ``(out, in)`` splits in two ways:

* **by columns of the output** (``ColumnParallelLinear``): rank ``r`` holds the rows
  ``W[r*out/N : (r+1)*out/N]`` and computes its slice of ``y``'s features. No communication
  forward: every rank already has all of ``x``.
* **by rows of the input** (``RowParallelLinear``): rank ``r`` holds the columns
  ``W[:, r*in/N : (r+1)*in/N]``, takes its slice of ``x``'s features and computes a *partial
  sum* of ``y``. An all-reduce adds the partial sums.

Megatron's trick (``ParallelMLP``): put a column-parallel layer first and a
row-parallel layer second. The first one's output is exactly the sharded input the second
one wants, and an elementwise activation in between works on shards. A whole MLP then costs
**one all-reduce forward and one all-reduce backward**. Attention works the same way with
heads as the unit (``ParallelAttention``), and so do the embedding and the output layer
with the vocabulary as the unit (``VocabParallelEmbedding``,
``vocab_parallel_cross_entropy``): the full ``(batch, seq, vocab)`` logits never exist
on any rank.

All the communication goes through six tiny functions (:mod:`.regions`), in conjugate
pairs: what one does forward, its partner does backward.

=========================================  =============================  =============================
function                                   forward                        backward
=========================================  =============================  =============================
``copy_to_parallel_region``            identity                       all-reduce
``reduce_from_parallel_region``        all-reduce                     identity
``scatter_to_parallel_region``         keep my slice of last dim      all-gather along last dim
``gather_from_parallel_region``        all-gather along last dim      keep my slice of last dim
``gather_from_sequence_region``        all-gather along sequence      reduce-scatter along sequence
``reduce_scatter_to_sequence_region``  reduce-scatter along sequence  all-gather along sequence
=========================================  =============================  =============================

The last pair is **sequence parallelism** (Korthikanti et al., 2023): between two
tensor-parallel regions (LayerNorm, residual adds, dropout), activations are replicated on
every rank: wasted memory. Instead, keep them split along the *sequence*, and replace each
all-reduce by a reduce-scatter (into sequence shards) and each identity-before-a-column-layer
by an all-gather. A ring all-reduce *is* a reduce-scatter followed by an all-gather
(chapter 2), so the bytes on the wire are the same; the activations between regions take
``1/N`` of the memory. The price: parameters used inside a sequence-sharded region (the
LayerNorms, the position embedding, the row-parallel biases) now see only their rank's part
of the sequence, so their gradients must be summed over the ranks
(``model.all_reduce_sequence_parallel_gradients``). And the column-parallel layers must not
keep the gathered input for backward, or it is replicated again
(``model.save_only_sequence_shards``).

The modules, in reading order:

* :mod:`.regions`: the six conjugate communication functions below, and nothing else;
* :mod:`.layers`: column- and row-parallel linear layers, the vocab-parallel embedding and
  cross-entropy, and how each layer slices a full weight (``shard_like``, ``load_full_weights``);
* :mod:`.model`: Megatron's MLP and attention, the whole tensor-parallel TinyGPT
  (``parallelize_gpt``, with the reference's parameter names), sequence parallelism;
* :mod:`.dtensor`: the same model sharded by torch's DTensor plans instead;
* :mod:`.experts`: expert parallelism, a mixture of experts whose experts live on different ranks.

Every rank must hold the *same full batch* (tensor parallelism does not split the data) and
run the same code: the collectives happen in the same order everywhere. Sizes must divide
evenly by ``N`` (out features of a column layer, in features of a row layer, heads,
vocabulary, sequence length); anything else raises a ``ValueError`` naming the sizes, as
Megatron does. Kept out, to stay readable: dropout (TinyGPT has none; under sequence
parallelism each rank would need its own random stream), overlap of communication with
compute, and mixed precision.
"""
