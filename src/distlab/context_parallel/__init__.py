"""Chapter 8: context parallelism: split the sequence through attention, not only around it.

Placeholder docstring; written out once the modules below exist.
"""
