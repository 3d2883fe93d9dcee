"""Reading results: tables beside the papers', curves and figures, the claims ledger, run health,
the replication report, and the notebooks' `Experiment`."""
