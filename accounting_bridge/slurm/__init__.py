"""Slurm's commands and the job records they print, for the bridge's processes and the daemon.

    slurmcmd   the one place that runs a Slurm command: SubprocessRunner (an argv, no shell,
               a timeout, SLURM_TIME_FORMAT=standard), SlurmCommandError, and FakeRunner,
               which answers only the argv it was given (tests)
    records    pure parsers, text in, records out: sacct --parsable2 and --json (SacctRun,
               ParseResult), squeue --json and the meter's --Format (SqueueJob, SqueueResult),
               and the argv that print them
    backends   where runs come from: JobSource, CommandsSource (sacct, squeue),
               PyslurmSource, and make_job_source, which picks one
    gc_pause   the cyclic garbage collector paused while many records are built

The values inside a record (TRES, hostlists, times, job ids) are read by slurmtext.
Nothing here reads or writes the ledger.
"""
