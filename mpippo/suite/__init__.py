"""Benchmark suites: games x seeds x variants as one Slurm job array (or a local queue), their
state, and a report against the Procgen paper. `python -m mpippo.suite --help`."""
