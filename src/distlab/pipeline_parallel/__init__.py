"""Chapter 6: pipeline parallelism from scratch: give every rank a few consecutive layers, and keep them all busy.

Data parallelism splits the batch, tensor parallelism splits each weight matrix; pipeline
parallelism splits the *depth*. With ``p`` ranks, rank ``s`` holds stage ``s``: a contiguous run
of the model's layers (stage 0 also the embeddings, the last stage also the final norm, the head
and the loss). A batch flows forward through the stages, each sending its output activation to
the next with a point-to-point ``send``; the gradient of that activation flows back the same
way. Each rank stores only ``1/p`` of the weights, and the only traffic is one activation-sized
tensor per stage boundary and direction.

The catch is the **bubble**. Run the whole batch forward through the stages and then backward
(``naive``), and only one rank works at any time: ``p - 1`` out of every ``p`` rank-seconds
are idle. The fix is to cut the batch into ``m`` **micro-batches** and keep several of them in
the pipe at once. Each schedule below is a different order in which a rank runs its pieces of
work, called *actions*: ``F`` (forward of micro-batch ``i``), ``B`` (its backward), and for
zero-bubble schedules ``B`` split in two, ``I`` (gradient of the stage's *input*, which the
previous stage waits for) and ``W`` (gradient of the stage's *weights*, which nobody waits for).
These are the letters of ``torch.distributed.pipelining``; the zero-bubble paper calls ``I``
"B".

==================  ===========================================  ===========================  ================================
schedule            order on stage ``s``                         idle fraction of the step    micro-batches held on stage ``s``
==================  ===========================================  ===========================  ================================
``naive``       F then B of the whole batch                  ``(p-1)/p``                  1 (the whole batch)
``gpipe``       all ``m`` F, then all ``m`` B                ``(p-1)/(m+p-1)``            ``m``
``one_f_one_b`` ``p-1-s`` F, then F,B,F,B..., then the B's   ``(p-1)/(m+p-1)``            ``min(p-s, m)``
``interleaved`` as 1F1B over ``v`` chunks per rank           ``(p-1)/(v*m+p-1)``          more than 1F1B
``zb_h1``       1F1B with B split in I and W, W's delayed    ``(p-1)/(3m+p-1)`` (*)       ``min(p, m)``
==================  ===========================================  ===========================  ================================

(*) for ``m >= p``, when F, I and W each take the same time; in general
``(p-1)(F+I-W) / (m(F+I+W) + (p-1)(F+I-W))`` (Qi et al., 2023, "Zero Bubble Pipeline
Parallelism"). The others assume a backward costs the same on every stage; the formulas count
idle time over the whole step, ``p`` ranks times its length (Megatron's papers quote the idle
time over the *useful* time instead, ``(p-1)/m``: the same bubble, another denominator).

GPipe (Huang et al., 2019) and 1F1B (PipeDream-Flush, Narayanan et al., 2019) have the same
bubble; 1F1B starts each micro-batch's backward as soon as it can, so stage ``s`` never holds
the activations of more than ``p - s`` micro-batches, where GPipe holds all ``m``. The
**interleaved** schedule (Narayanan et al., 2021, "Megatron-LM" at scale) cuts the model into
``p * v`` chunks and gives rank ``r`` the chunks ``r, r + p, r + 2p, ...``: the pipeline fills
``v`` times faster, so the bubble shrinks ``v`` times, for ``v`` times more messages.
**ZB-H1** splits the backward: the ``I`` passes run the critical path back through the stages
quickly, and the ``W`` passes, which depend on nothing downstream, fill the idle slots.

The modules, one idea each:

1. :mod:`.stages`: cut a :class:`distlab.models.TinyGPT` into chunks whose parameters keep the
   reference's names, so gradients compare name by name;
2. :mod:`.schedules`: one small function per schedule, returning every rank's ordered list of
   actions; :mod:`.zero_bubble`: the split of B into I and W for the zero-bubble schedules;
3. :mod:`.timeline`: the same action lists played with fixed costs and no processes
   (``simulate``: what the book's widget draws, and a deadlock finder), the bubble of a
   measured or modelled timeline, and its Gantt chart; :mod:`.measured_model`: the same
   simulation with the machine's message costs and stage times, read off measured timelines,
   which predicts the measured bubble where the formulas cannot;
4. :mod:`.executor`: one rank runs its action list with ``isend``/``irecv``;
5. :mod:`.training`: one training step on a rank (gradients, loss, timeline, memory);
   :mod:`.torch_pipelining`: the same step with ``torch.distributed.pipelining``.

The loss is the mean over the *full* batch: each micro-batch's mean loss is divided by ``m``, and
the gradients of the ``m`` backwards add up in ``.grad``, so after a step they equal the
single-process full-batch gradients (up to float32 rounding).

Kept out, to stay readable: combining with data or tensor parallelism (chapter 7; ``group=``
runs a pipeline inside a process group for that), activation checkpointing, any overlap of
messages with compute beyond receiving one action ahead, stages of unequal size, tied
embeddings, and the V-shaped schedules (ZB-V, DualPipe-V), which :mod:`.torch_pipelining`
runs through torch.
"""
