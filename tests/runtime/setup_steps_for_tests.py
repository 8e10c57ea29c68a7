"""Rank setup steps used by the tests (imported on the ranks through the caller's sys.path)."""

MARK = {"value": None}


def mark(value):
    MARK["value"] = value

    def undo():
        MARK["value"] = None
    return undo


def read_mark():
    return MARK["value"]
