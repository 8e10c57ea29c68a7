"""nbgrader's plumbing: the instructor's commands run as nbgrader runs them, with the course's plugins.

* :mod:`distlab.grade.pipeline.nbplugins`: the plugins ``grader/nbgrader_config.py`` installs:
  the notebook's cells in the grading kernel, its hidden tests in the clean room (both from
  :mod:`distlab.grade.boundary`), each phase in its own capped control group;
* :mod:`distlab.grade.pipeline.grading_kernel`: the kernel manager those cells run under, which
  puts the boundary's pieces (sandbox, keeper, private sockets, capped messages) in start order;
* :mod:`distlab.grade.pipeline.run_nbgrader` runs one nbgrader command as its own process, its
  log tidied and bounded, through :mod:`distlab.grade.pipeline.nbgrader_app` (nbgrader's command
  line, started cheaply);
* :mod:`distlab.grade.pipeline.release` writes the student version of each assignment from
  ``solutions/`` (never a half-written ``notebooks/``);
* :mod:`distlab.grade.pipeline.feedback` and ``templates/`` beside it: the feedback page a
  student reads.

What it guarantees: every nbgrader step a student's work goes through is started here, with the
course's configuration and the boundary's plugins; nothing here runs student code itself.
"""
