"""The class: submissions taken from the exchange, a class graded on the cluster, the grades out.

* :mod:`distlab.grade.course.exchange`: ``collect`` from nbgrader's exchange on a multi-user hub,
  judging each entry of ``inbound`` on its own and trusting nothing a student wrote there (a
  name, a link, a timestamp): one odd entry is refused by name, everyone else is collected;
* :mod:`distlab.grade.course.cluster`: ``autograde --slurm``, one Slurm job per submission as a
  job array, each graded as the instructor's machine grades it;
* :mod:`distlab.grade.course.grades_csv`: the class's grades as a spreadsheet reads them.

What it guarantees: one student's submission, however odd, neither stops nor changes the
grading of another's; the instructor's commands (:mod:`distlab.grade.__main__`) reach the class
only through these modules.
"""
