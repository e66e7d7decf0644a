"""`gpucredit bridge sacct` and `gpucredit bridge reconcile`: Slurm's finished runs, charged
exactly, once.

    ingest     a round: the finished runs of the window since the persisted cursor (with an
               overlap), reconciled, then the cursor moved (ingest_round)
    reconcile  each run against its hold: plan_run, a pure planner whose docstring is the
               decision table (docs/design.md §9), and the batched reads and writes around it
               (reconcile_runs, reconcile_stored)
    cli        the two commands (the `bridge` group that holds them is accounting_bridge/cli.py)
"""
