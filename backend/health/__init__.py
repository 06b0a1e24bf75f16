"""Liveness and readiness: GET /api/v1/health and /api/v1/ready."""
