"""Read models: reports, history, efficiency and site-wide figures."""
