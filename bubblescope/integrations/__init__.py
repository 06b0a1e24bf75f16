"""Framework integrations: a framework's trainer run with the collector, nothing of the service imported."""
