"""Showing reference code on a page: the source itself, read from the package, never a copy.

A page that explains a function prints it with :func:`show`: what the reader sees is what the
package runs, so the text and the code cannot drift apart.
"""

from __future__ import annotations

import inspect
import textwrap

FENCE = "`" * 3


def show(*objects):
    """The source of functions, classes or methods, as one highlighted Python block (IPython Markdown).

    A method is shown from its ``def``, without its class's indentation.
    """
    from IPython.display import Markdown

    code = "\n\n".join(textwrap.dedent(inspect.getsource(o)) for o in objects)
    return Markdown(f"{FENCE}python\n{code}{FENCE}")
