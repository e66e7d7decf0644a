"""Flask portal: web pages, the JSON API (/api/v1) and /metrics."""
