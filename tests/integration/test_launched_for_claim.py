"""The built-in queue's claim hands a ready burst node first to the jobs it was launched for, on
real stores (SQLite and PostgreSQL): the executor records the plan's ``Launch.jobs`` with the
node (``nodes.launched_for``, migration 0017), and the claim reads them back; a node launched for
no job, or whose jobs are no longer pending, takes the oldest pending job that fits, as before."""

from __future__ import annotations

from datetime import timedelta

from orchestrator.store import Store
from tests.builders import POOL, T0, make_rig

M = timedelta(minutes=1)


def test_a_node_goes_to_the_job_it_was_launched_for_then_to_the_oldest(store: Store) -> None:
    rig = make_rig(store)
    old = store.submit_job("nlp", POOL, 8, 0, 3600.0, None, T0)
    late = store.submit_job("nlp", POOL, 8, 0, 3600.0, None, T0 + 5 * M)
    other = store.submit_job("nlp", POOL, 8, 0, 3600.0, None, T0 + 6 * M)
    rig.launched_ready("n-late", (late.id,), T0 + M)
    node = store.get_node("n-late")
    assert node.launched_for == (late.id,)
    assert [n.launched_for for n in store.nodes() if n.id == "n-late"] == [(late.id,)]  # (raw read)
    [intent] = [e for e in store.events("n-late") if e.from_state is None]
    assert intent.details["jobs"] == [late.id]

    claimed = rig.queue.claim_for_node(node, 8, T0 + 10 * M)
    assert claimed is not None and claimed.id == late.id
    assert store.get_job(old.id).state.value == "pending"

    rig.launched_ready("n-none", (), T0 + M)  # min-nodes, pre-warm: no job
    assert store.get_node("n-none").launched_for == ()
    assert [n.launched_for for n in store.nodes() if n.id == "n-none"] == [()]
    assert rig.queue.claim_for_node(store.get_node("n-none"), 8, T0 + 11 * M).id == old.id

    rig.launched_ready("n-late2", (late.id,), T0 + M)  # its job already runs on n-late: the oldest left
    assert rig.queue.claim_for_node(store.get_node("n-late2"), 8, T0 + 12 * M).id == other.id
