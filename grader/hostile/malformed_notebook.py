"""The submitted file is not a notebook at all (truncated JSON).

Expected: autograde reports a clear error for this student and goes on with the others;
this student scores 0 on every task.
"""
AFFECTED = ["task1-tests", "task2-tests", "concept-a-tests", "concept-b-tests", "concept-c-tests"]


def RAW():
    return b'{"cells": [{"cell_type": "code", "source": "def my_rank(): ret'
