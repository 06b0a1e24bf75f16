"""What the features derive from a stored run, through the analysis' entry point: a step broken down,
the run's report, its straggler report, the alert rules' figures, and the answers cached per revision.
Each is computed once per (run, revision) in a process and shared by every feature that asks
(``store.memo``). Imports the store and the shared bottom, never a feature."""
