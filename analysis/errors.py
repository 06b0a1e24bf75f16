"""The analysis layer's one error kind: an input it cannot work with, naming the field.

``field`` is a dotted path (``schedule``, ``layers_per_stage``, ``config.tp``); ``path`` splits it.
The service maps every ``InputError`` to a 422 that names the field (``backend/errors.py``).
"""

from __future__ import annotations


class InputError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.field.split("."))
