"""The C hot path of the collector; everything else is declared in pyproject.toml.

``optional``: without a C compiler the install still succeeds and the collector uses its
Python wrappers (``bubblescope.collector.native`` picks).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("bubblescope.collector._hotpath", ["collector/_hotpath.c"], optional=True)])
