"""PyTorch Flight Recorder dumps of a run: uploaded one rank a request, read together (docs/traces.md)."""
