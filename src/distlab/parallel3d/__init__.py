"""Chapter 7: 3D parallelism: data, pipeline and tensor parallelism at once, and choosing the layout.

* :mod:`.mesh`: the rank grid, pure arithmetic (:class:`~.mesh.Grid`: coordinates and the
  three groups of every rank), and on running ranks one process group per axis
  (:class:`~.mesh.ProcessGrid`, like picotron's process-group manager) or torch's ``DeviceMesh``;
* :mod:`.train`: one training step that nests chapters 3, 5 and 6 on the grid, from scratch;
  :mod:`.torch_train`: the same with DTensor tensor parallelism and FSDP2;
  :mod:`.runs`: several layouts trained in one launch, from a notebook;
* :mod:`.planner`: a layout priced on paper (memory, bytes, time) before running anything;
  :mod:`.recommend`: the usual procedure for choosing one; :mod:`.context`: the context-parallel
  axis (chapter 8) priced for both; :mod:`.predict`: the exact bytes of the book's small runs.

:mod:`.mesh`, :mod:`.planner`, :mod:`.context`, :mod:`.recommend` and :mod:`.predict` import no torch: they run
in any notebook cell and in the book's widgets.
"""
