"""job_submit.lua (runs inside slurmctld) and the Python side that answers it."""
