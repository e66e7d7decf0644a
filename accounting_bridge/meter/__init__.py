"""`gpucredit bridge meter`: running jobs' cost so far, and the holds that need a charge now.

    meter  Meter (one tick: the running jobs from squeue, the active holds, the charges,
           lease renewals and day-end charges due, and the cancels of jobs that ran out),
           CompactSqueue (the running jobs), meter_command

Its part of a job's life is docs/design.md §3.3.
"""
