"""Jobs submitted, read and cancelled for a portal user: the submitter service
(`submitter`), the backend interface the API calls (`backend`), and what the API
checks of a job before anything reaches Slurm (`spec`)."""
