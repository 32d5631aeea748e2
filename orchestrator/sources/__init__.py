"""Queue sources: where pending work and on-prem capacity are read from (built-in queue, Slurm)."""
