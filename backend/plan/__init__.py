"""POST /api/v1/plan: the first-principles planner over HTTP."""
