"""The instruments every chapter uses to look inside a run, and the helpers its code shares.

* :mod:`.comm`: record every ``torch.distributed`` call a rank makes, with the bytes it moves
  (:mod:`.comm_bytes`: the counting rules, and :func:`~.comm_bytes.all_reduce_bytes`);
* :mod:`.trace`: per-rank timelines of compute and communication, drawn as a Gantt chart;
* :mod:`.memory`: the bytes of parameters, gradients, optimizer state and activations a rank
  holds, and peaks;
* :mod:`.monitor`: throughput, utilisation and MFU of a run, logged for TensorBoard;
* :mod:`.groups`: a rank's place in a process group.
"""
