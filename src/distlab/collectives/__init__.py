"""Chapter 2: collectives from point-to-point messages, and what they cost.

* :mod:`.all_reduce`: the naive, tree and ring all-reduce; the ring as a reduce-scatter
  (:func:`~.all_reduce.ring_reduce_scatter`) followed by an all-gather
  (:func:`~.all_reduce.ring_all_gather`), built from ``isend``/``irecv`` alone;
* :mod:`.cost_model`: the α-β model of each, fitted to measured times, and bus bandwidth.
"""
