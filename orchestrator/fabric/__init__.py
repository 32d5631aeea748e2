"""Fabric: how a burst node joins the training fabric and leaves it again.

``tokens`` issues join tokens and node credentials; ``bootstrap`` renders and parses the node's
user-data (node id, controller address, join token); ``agent`` is the node agent that registers
with the controller, heartbeats, runs work from the built-in queue and honours drains; ``builtin``
is the controller side of that fabric. Slurm and torch-elastic join/drain live beside them.

Kept free of eager imports: the node agent runs on a bare cloud node and must start with the
standard library alone, so importing this package must not pull in anything else.
"""
