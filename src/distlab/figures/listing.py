"""Showing reference code on a page: the source itself, read from the package, never a copy.

A page that explains a function prints it with :func:`show`: what the reader sees is what the
package runs, so the text and the code cannot drift apart.
"""

from __future__ import annotations

import inspect

FENCE = "`" * 3


def show(*objects):
    """The source of functions, classes or methods, as one highlighted Python block (IPython Markdown)."""
    from IPython.display import Markdown

    code = "\n\n".join(inspect.getsource(o) for o in objects)
    return Markdown(f"{FENCE}python\n{code}{FENCE}")
