"""How much of one piece of Python is a copy of another, up to renaming and layout.

(The book's tests, the package's copy test and ``python -m distlab.grade page`` use it.)

The book must not print the code a graded task asks for: a student who adapts a listing scores
without having understood the page. "Adapting" means renaming variables, reformatting and
reordering a little, so the comparison works on token sequences:

- comments, blank lines and indentation are dropped; strings become ``STR``, numbers ``NUM``;
- every name becomes ``ID`` except keywords, builtins, the modules everyone imports (``torch``,
  ``dist``, ``nn``, ``F``, ``math``), ``self``, and names after a dot: the API a piece of code
  calls (``.all_reduce``, ``.register_post_accumulate_grad_hook``) is what makes it
  distinctive, the local names are what a copier changes.

:func:`copied_fraction` is the share of one sequence's tokens that lie in runs of at least
``MIN_RUN`` tokens matching another. Runs shorter than that are idioms every solution shares
(``dist.all_reduce(ID, op=dist.ReduceOp.SUM)`` alone is 12 tokens, so the floor sits just under
it); a renamed copy of a function keeps nearly all its tokens in long runs.
"""

from __future__ import annotations

import builtins
import io
import keyword
import tokenize
from difflib import SequenceMatcher
from html.parser import HTMLParser

MIN_RUN = 10
# A solution is a near-copy when at least this share of it comes from one listing. Measured on
# the book before the chapters were re-balanced: printed references covered 0.65-0.81 of the
# graded solutions they solved; independent code on related topics stays under 0.45.
NEAR_COPY = 0.5
COMMON_MODULES = {"torch", "dist", "nn", "F", "math", "self"}
SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENDMARKER}


def normalised_tokens(code: str, lines: set[int] | None = None) -> list[str]:
    """The comparable tokens of ``code`` (only those on ``lines``, 1-based, when given).

    Code that does not tokenize (a listing cut mid-string, console output) gives the tokens read
    before the error: output blocks are prose, not code, and compare as little.
    """
    out: list[str] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type in SKIPPED or (lines is not None and token.start[0] not in lines):
                continue
            if token.type == tokenize.NAME:
                name = token.string
                kept = (keyword.iskeyword(name) or name in COMMON_MODULES or hasattr(builtins, name)
                        or (out and out[-1] == "."))
                out.append(name if kept else "ID")
            elif token.type == tokenize.STRING:
                out.append("STR")
            elif token.type == tokenize.NUMBER:
                out.append("NUM")
            else:
                out.append(token.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def copied_fraction(tokens: list[str], listings: list[list[str]]) -> float:
    """The share of ``tokens`` found in runs of at least ``MIN_RUN`` tokens of any of
    ``listings`` (one page's blocks: a class printed method by method counts as printed)."""
    if not tokens:
        return 0.0
    copied = [False] * len(tokens)
    for listing in listings:
        matcher = SequenceMatcher(None, tokens, listing, autojunk=False)
        for run in matcher.get_matching_blocks():
            if run.size >= MIN_RUN:
                copied[run.a:run.a + run.size] = [True] * run.size
    return sum(copied) / len(tokens)


class _PreBlocks(HTMLParser):
    """The text of every ``<pre>`` element of an HTML page (code cells, listings, outputs)."""

    def __init__(self):
        super().__init__()
        self.blocks: list[str] = []
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        if tag == "pre":
            if self._depth == 0:
                self.blocks.append("")
            self._depth += 1

    def handle_endtag(self, tag):
        if tag == "pre" and self._depth:
            self._depth -= 1

    def handle_data(self, data):
        if self._depth:
            self.blocks[-1] += data


def code_blocks_of_html(page: str) -> list[str]:
    """Every preformatted block a rendered page shows, as plain text."""
    parser = _PreBlocks()  # entities come back decoded (convert_charrefs)
    parser.feed(page)
    return parser.blocks
