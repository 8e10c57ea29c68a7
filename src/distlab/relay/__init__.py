"""The relay: a network the grader owns, through which graded ranks send everything.

MIT's distributed-systems course (6.5840) grades its labs with ``labrpc``: the servers a test
starts never talk to each other directly; every message goes through the tester, which counts
it, and could delay or drop it. The relay does the same for ``torch.distributed``:

* :mod:`~distlab.relay.backend`: a backend named ``"relay"`` that a rank joins instead of gloo
  or NCCL; every send and every collective becomes a frame on one inherited descriptor.
* :mod:`~distlab.relay.router`: the other end of every rank's descriptor, in the process that
  launched the ranks; it delivers messages, performs collectives, and records both.
* :mod:`~distlab.relay.record`: what the router recorded, and the exercises' rules checked on it.
* :mod:`~distlab.relay.frames` and :mod:`~distlab.relay.collectives`: the frames on the wire,
  and the collectives computed in one place.

``distlab.run(fn, nprocs=4, backend="relay")`` runs on it (with the fork launcher). The book's
pages and your own experiments keep gloo or NCCL: the relay is for graded runs, where what a
rank sent must be a fact recorded outside the rank.
"""
