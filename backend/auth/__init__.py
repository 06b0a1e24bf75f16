"""Access control: API tokens with one scope each, the route → scope table, the signed-in session.

- ``scopes.py``: the three scopes and which one grants which (admin grants all);
- ``route_access.py``: THE table of what every route needs (a test checks each route of the app is in it);
- ``tokens.py``: a token's text, its SHA-256 digest and its prefix;
- ``queries.py``, ``service.py``: the ``api_tokens`` table: create, list, revoke;
- ``cache.py``: known tokens for a few seconds, so ingest does not pay a query per batch;
- ``guard.py``: the dependency every route runs (``create_app``): 401/403 with ``WWW-Authenticate``;
- ``router.py``: sign in and out (the dashboard's cookie), and the admin endpoints for tokens;
- ``commands.py``: ``bubblescope token create|list|revoke`` and ``serve``'s checks.

What a person reads: docs/access.md.
"""
