"""Chapter 2: collectives from point-to-point messages, and what they cost.

* :mod:`.all_reduce`: the naive, tree and ring all-reduce; the ring as a reduce-scatter
  (:func:`~.all_reduce.ring_reduce_scatter`) followed by an all-gather
  (:func:`~.all_reduce.ring_all_gather`), built from ``isend``/``irecv`` alone;
* :mod:`.faster_ring`: the same ring with the waste profiled out of it (no temporaries, a
  kept scratch buffer, optionally pipelined segments), within reach of gloo's built-in;
* :mod:`.cost_model`: the α-β model of each, fitted to measured times, and bus bandwidth.
"""
