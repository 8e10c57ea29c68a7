"""Chapter 8: context parallelism: split the sequence through attention, not only around it.

Data parallelism splits the batch, tensor parallelism each weight matrix, pipeline parallelism
the depth. At long context none of them is enough: every layer's activations grow with the
sequence, and sequence parallelism (chapter 5) shards them only *outside* attention, because
attention mixes every token with every other. Context parallelism (the "CP" of 5D parallelism)
keeps each rank's share of the tokens sharded *through* attention as well: rank ``r`` holds
the queries, keys and values of its tokens only, and the ranks exchange keys and values (or
heads) so that every query still meets every key. Everything outside attention is per token,
so it needs no communication at all.

Two things make this possible:

1. **Attention can be computed one key block at a time, exactly.** A block's partial result
   and its log-sum-exp are all that is needed to merge it with the others
   (:mod:`.blockwise`): the online softmax of FlashAttention, done across ranks instead of
   across a GPU's on-chip memory.
2. **Heads are independent.** An all-to-all can turn "all heads of my tokens" into "my heads
   of all tokens" and back (:mod:`.ulysses`).

=================  ===========================================  ==================================================
method             what travels                                 bytes per rank, forward (``E``: one whole q/k/v)
=================  ===========================================  ==================================================
ring attention     key/value blocks to the right neighbour,     ``2 (N-1)/N E``: ``N-1`` blocks of ``2E/N``
                   overlapped with the current block's compute
Ulysses            four all-to-alls (q, k, v, output)           ``4 (N-1)/N^2 E``: ``2/N`` of the ring's
=================  ===========================================  ==================================================

The ring works for any number of ranks and hides its messages behind compute; Ulysses sends
less and uses any attention kernel, but needs the heads to split evenly over the ranks (at
most the number of key/value heads). Production systems mix and vary them: Llama 3
all-gathers the keys and values instead of passing them round (with the balanced layout
below), and USP (Fang and Zhao, 2024) runs Ulysses inside a node and a ring across nodes.

**Causal masking** breaks the ring's balance: cut the sequence in order and the last rank's
queries see every key while the first rank's see only their own. :mod:`.balance` gives rank
``r`` chunks ``r`` and ``2N-1-r`` of ``2N``, which evens the work out exactly.

The modules, in reading order:

* :mod:`.blockwise`: attention over one block as ``(output, log-sum-exp)``, the exact merge,
  and a block's share of the gradients;
* :mod:`.layout`: which tokens each rank holds (``2N`` chunks), sharding and unsharding;
* :mod:`.ring`: ring attention forward and backward (an autograd function) and its bytes;
* :mod:`.balance`: the load-balanced causal layout and the work per rank;
* :mod:`.ulysses`: DeepSpeed-Ulysses' all-to-alls around ordinary attention, and its bytes;
* :mod:`.torch_native`: torch's own ring attention, run on the CPU kernels beside ours, and
  why its public ``context_parallel()`` does not run causal attention on the CPU;
* :mod:`.model`: a whole TinyGPT run by every rank on its own tokens, attention by ring or Ulysses;
* :mod:`.timeline`: the ring's compute, transfers and waits on every rank, measured.

Tensors are ``(batch, heads, tokens, head_dim)`` as for ``F.scaled_dot_product_attention``;
every rank holds its own tokens in the order its layout gives. Kept out, to stay readable:
grouped-query attention (keys and values with fewer heads), dropout inside attention, and
mixed precision (everything runs in the inputs' dtype; FlashAttention keeps the running sums in
float32 for bfloat16 inputs).
"""
