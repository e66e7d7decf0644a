"""Pricing: prices, quotes, routing and job_submit's snapshot."""
