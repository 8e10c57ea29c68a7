"""The trust boundary: everything that stands between a student's code and the grade.

Read this folder whole to know what a submission's code can reach; nothing outside it runs a
line of student code or reads a byte that student code wrote, except through it. What it holds,
in the order a submission meets it:

* the grading kernel (:mod:`distlab.grade.boundary.kernel`), on Unix sockets in a folder only
  the grader can enter (:mod:`distlab.grade.boundary.kernel_sockets`), its messages capped
  before they are read (:mod:`distlab.grade.boundary.kernel_messages`);
* the clean room (:mod:`distlab.grade.boundary.cleanroom`), which runs the hidden tests and never
  a line of student code itself: on each rank a stand-in (:mod:`distlab.grade.boundary.sandbox`)
  runs the student's cells, on warm ranks (:mod:`distlab.grade.boundary.warm_ranks`), each rank
  in a room of its own (:mod:`distlab.grade.boundary.rank_room`); jobs and verdicts travel
  over pipes only the grader and the clean room hold (:mod:`distlab.grade.boundary.pipes`),
  results as plain data (:mod:`distlab.grade.boundary.safeload`);
* the operating system's walls: bubblewrap's namespaces (:mod:`distlab.grade.boundary.bubblewrap`),
  ended with the grader however it ends (:mod:`distlab.grade.boundary.sandbox_keeper`),
  a control group per phase (:mod:`distlab.grade.boundary.submission_caps`,
  :mod:`distlab.grade.boundary.cgroups`), per-process caps (:mod:`distlab.grade.boundary.limits`),
  capped memory file systems to write in (:mod:`distlab.grade.boundary.scratch`), bytes on the
  wire counted outside the ranks (:mod:`distlab.grade.boundary.wire`);
* the guards inside Python: forbidden APIs and collectives (:mod:`distlab.grade.boundary.forbid`,
  :mod:`distlab.grade.boundary.forbid_collectives`), protected files and processes
  (:mod:`distlab.grade.boundary.protect`);
* what the student's processes print, capped and marked on its way to the instructor
  (:mod:`distlab.grade.boundary.student_output`).

What it guarantees (the threat model of the instructor's guide holds the evidence): a student's
code reaches no file, process, socket or classmate beyond its own scratch folders; it cannot
choose a verdict, a path a privileged process follows, or a permission one sets; and it is
capped in memory, processes, time, output and disk. It imports nothing from the other rooms of
:mod:`distlab.grade` but their shared settings (:mod:`distlab.grade.config`) and the failure a
check raises (:mod:`distlab.grade.failures`): a change elsewhere cannot weaken it unseen.
"""
