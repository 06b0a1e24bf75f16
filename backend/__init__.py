"""The Bubblescope service: FastAPI app, database, analysis. Needs ``bubblescope[server]``."""
