"""Running configs: the content-addressed run store, profiles and grids, executors (local, jobs,
Ray), costs and budgets, tuning, progress. Nothing here changes a result."""
