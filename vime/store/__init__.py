"""Rollout storage beyond the run's own buffer: the shared store on a PostgreSQL server
(``rollout.store``), that rollout workers fill and the trainer takes from (docs/scaling.md).
"""
