"""What the book's pages share to draw: plots, interactive widgets, source listings.

* :mod:`.plots`: small matplotlib helpers (a table of numbers per rank, the "measured on" label);
* :mod:`.widgets`: widgets whose every view is computed while the page builds, so they work
  in the static, published book;
* :mod:`.listing`: :func:`~.listing.show`, the source of a reference function on a page.

(Named ``figures``, not ``book``: the repository's ``book/`` folder holds the pages themselves.)
"""
