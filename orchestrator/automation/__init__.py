"""Automation: what drives the control loop in production (Celery app, beat schedule, tasks) and
the leader lease in Redis that lets only one planner act per policy per tick."""
