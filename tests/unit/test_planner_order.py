"""The scheduling order on the columns equals sorting the jobs one by one in Python: higher
project priority, higher job priority, older, then id (code point order, as ``str`` compares),
then queue position. Ties in submit time are where the id decides; the ids are read as words of
their bytes when they are ASCII (:func:`orchestrator.planner.order._id_words`) and as a numpy
string array otherwise, and both must give ``str``'s order, duplicates and ids longer than one
word included.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.pending import PendingColumns
from orchestrator.planner import demand as demand_module
from orchestrator.planner.demand import ordered
from orchestrator.planner.order import id_ranks, time_ranks
from tests.builders import T0, make_job, make_policy

M = timedelta(minutes=1)
PROJECTS = [{"name": "a", "priority": 2}, {"name": "b", "priority": 0}, {"name": "c", "priority": 2}]

# Short and long ids, shared prefixes (one word and more), duplicates, and some not ASCII.
ASCII_IDS = st.text(alphabet="ab0129-_./zZ~ ", min_size=1, max_size=19)
ANY_IDS = st.one_of(ASCII_IDS, st.text(alphabet="aé€😀b1\n", min_size=1, max_size=10))
SPECS = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 2), st.integers(0, 3),
                           st.integers(0, 11)), max_size=60)


def _reference(jobs: tuple) -> list[int]:
    priority = {p["name"]: p["priority"] for p in PROJECTS}
    return sorted(range(len(jobs)), key=lambda i: (-priority[jobs[i].project], -jobs[i].priority,
                                                   jobs[i].submitted_at, jobs[i].id, i))


@settings(max_examples=300, deadline=None)
@given(SPECS, st.lists(ASCII_IDS, min_size=12, max_size=12),
       st.lists(ANY_IDS, min_size=12, max_size=12), st.booleans())
def test_the_order_on_the_columns_is_pythons(specs, ascii_ids, any_ids, mixed) -> None:
    names = any_ids if mixed else ascii_ids
    jobs = tuple(make_job(names[k], project=p, priority=prio, submitted_at=T0 - age * M)
                 for p, prio, age, k in specs)
    demand_module._ORDER_MEMO.clear()
    order = ordered(jobs, make_policy(projects=PROJECTS)).order.tolist()
    assert order == _reference(jobs)


@settings(max_examples=200, deadline=None)
@given(SPECS, st.lists(ASCII_IDS, min_size=12, max_size=12),
       st.lists(ANY_IDS, min_size=12, max_size=12), st.booleans(),
       st.lists(st.integers(0, 59), max_size=60), st.booleans())
def test_ids_ranked_up_front_give_the_same_order(specs, ascii_ids, any_ids, mixed, picks,
                                                 by_time) -> None:
    # The simulator ranks every id of a trace once, and every job by (submit time, id), and
    # selects the pending rows (PendingColumns.id_rank, time_rank): the order of any selection
    # is still Python's.
    names = any_ids if mixed else ascii_ids
    jobs = tuple(make_job(names[k], project=p, priority=prio, submitted_at=T0 - age * M)
                 for p, prio, age, k in specs)
    every = PendingColumns.from_jobs(jobs, "gpu")
    every.id_rank = id_ranks(every.ids)
    if by_time:
        every.time_rank = time_ranks(every.submitted_us, every.id_rank)
    rows = [i for i in picks if i < len(jobs)]
    chosen = every.select(rows, jobs=[jobs[i] for i in rows])
    demand_module._ORDER_MEMO.clear()
    order = ordered(chosen, make_policy(projects=PROJECTS)).order.tolist()
    assert order == _reference(tuple(jobs[i] for i in rows))
