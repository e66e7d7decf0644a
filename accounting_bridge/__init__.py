"""Slurm accounting <-> ledger: sacct ingestion, NVML sampling, reconciliation, metering."""
