"""The cost ledger: what burst nodes (and on-prem work) cost, for whom, reconciled to the cent.

* :mod:`~orchestrator.costs.attribution`: pure maths, one node's billing span into cost lines.
* :mod:`~orchestrator.costs.ledger`: ``roll_up(store, policies, now)``, the incremental,
  idempotent writer of the ledger (run each tick and by ``burst.cost.rollup``).
* :mod:`~orchestrator.costs.report`: ``cost_report(store, query)``, grouped sums whose cents add
  up to the total's (the HTTP API and the CLI read it).
* :mod:`~orchestrator.costs.spend`: ``spend`` and ``burn_rate_usd_hour`` for budgets.

This layer sits above the store and the planner and below the queue sources: it reads and
writes through the Store and knows nothing of providers. See docs/costs.md.
"""
