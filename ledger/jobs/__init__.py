"""The bridge's ingested job runs."""
