"""The job side of the store: Slurm's records of job runs as the bridge reconciled them,
the cursors of its readers, and jobs' retry policies. No money moves here (that is
ledger.api's).

    jobruns         the job_runs projection, the readers' cursors, lean hold views for
                    reconciliation (upsert_job_runs, load_job_runs, load_hold_views,
                    read_cursor, write_cursor, JobRunRow)
    jobrun_records  one compact text per stored run, read in bulk (stored_records_in_turn)
    retries         a job's retry policy, kept when the portal submits it, and each retry
                    the daemon's retry pass decides (RetryPolicy, job_retries, record_retry)
"""
