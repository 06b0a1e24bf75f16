"""GET /api/v1/settings (admin): the ``ServiceSettings`` in force, secrets left out."""
