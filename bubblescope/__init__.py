"""Bubblescope: pipeline-bubble and parallelism diagnostics for distributed PyTorch training.

Import the in-job hook as ``from bubblescope import collector``. This package imports nothing
heavy on its own: the server lives in ``bubblescope.backend`` (extra ``bubblescope[server]``).
"""

__version__ = "0.1.0"
