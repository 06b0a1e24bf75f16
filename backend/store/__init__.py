"""The store: reading and writing what every feature shares (runs, ranks, steps, spans, capture
requests), a run's state, the revision bump after ingest, and the memo that keys results by revision.
Beneath the features and ``derived``; imports the database layer and the shared bottom only."""
