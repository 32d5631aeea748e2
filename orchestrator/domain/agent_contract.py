"""The promises a node agent makes to the controller, shared by the agent and the liveness rules.

The reconciler judges a node dead from its heartbeats; the agent decides how it retries when the
controller does not answer. Both read these figures from here, so the liveness rule cannot assume a
retry behaviour the agent does not have.

A promise without a figure: an agent asks for work (``jobs/next``) only when it runs no job and
has no run result left to report. So the dispatcher may treat a job still recorded running on an
asking node as a hand-out that never arrived (the controller died before answering) and offer that
same run again (``BuiltinQueue.claim_for_node``).
"""

from __future__ import annotations

#: An agent that cannot reach the controller keeps heartbeating, backing off from its interval up
#: to this many seconds between attempts. So once the controller answers again, a live agent is heard
#: within this long (plus its request timeout), and silence beyond that is the node's, not ours.
HEARTBEAT_RETRY_MAX_S = 10.0

#: The longest one heartbeat request waits for its answer before it counts as failed.
HEARTBEAT_REQUEST_TIMEOUT_S = 5.0
