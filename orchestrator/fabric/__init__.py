"""Fabric: how a burst node joins the training fabric and leaves it again without losing work.

``tokens`` issues join tokens and node credentials; ``bootstrap`` renders and parses the node's
user-data (node id, controller address, join token); ``agent`` is the node agent that registers
with the controller, heartbeats, runs work and honours drains, with ``node_facts`` (GPU inventory,
spot notices). The fabrics, each with a controller side and a node side:

* built-in queue: ``builtin`` (the agent pulls jobs of burst's own queue);
* Slurm: ``slurm`` (identity, drain in Slurm, clean-up) and ``slurm_node`` (slurmd, the
  checkpoint-and-requeue drain);
* PyTorch elastic: ``torch_elastic``, ``torch_store`` (the rendezvous store the controller
  hosts), ``torch_node`` (torchrun) and ``elastic_hooks`` (the training job's side of the drain);

and ``router`` puts them behind one Fabric port. docs/fabric.md describes them.

Kept free of eager imports: the node agent runs on a bare cloud node and must start with the
standard library alone, so importing this package must not pull in anything else.
"""
