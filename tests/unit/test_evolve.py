"""``evolve`` gives what ``dataclasses.replace`` gives: the same copy, the same refusals."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.domain.evolve import _COPIERS, _Copier, evolve
from orchestrator.domain.nodes import Node, NodeState
from tests.builders import T0, make_node

CHANGES = st.fixed_dictionaries({}, optional={
    "state": st.sampled_from(list(NodeState)),
    "state_since": st.integers(0, 10**6).map(lambda s: T0 + timedelta(seconds=s)),
    "gpus_busy": st.integers(0, 8),
    "running_jobs": st.integers(0, 8),
    "released": st.booleans(),
    "version": st.integers(0, 100),
    "instance_id": st.none() | st.text(max_size=5),
    "launched_for": st.lists(st.text(max_size=3), max_size=3).map(tuple),
    "gpu_utilisation_percent": st.none() | st.floats(0, 100),
})


@given(CHANGES)
def test_a_node_evolves_as_replace_builds_it(changes):
    node = make_node("n1", gpus_busy=1, version=3)
    new = evolve(node, **changes)
    assert new == replace(node, **changes)
    assert type(new) is Node and new is not node
    assert node == make_node("n1", gpus_busy=1, version=3)  # the original is untouched
    for f in fields(Node):  # every slot is set, none shared by accident of the fast path
        assert getattr(new, f.name) is changes.get(f.name, getattr(node, f.name))


def test_a_node_takes_the_fast_path_and_refuses_an_unknown_field_as_replace_does():
    node = make_node()
    evolve(node, version=1)
    assert isinstance(_COPIERS[Node], _Copier)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        evolve(node, colour="red")
    with pytest.raises(TypeError):
        replace(node, colour="red")
    with pytest.raises(AttributeError):  # the copy is as frozen as the original
        evolve(node).version = 2  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class Checked:
    value: int
    twice: int = 0

    def __post_init__(self):
        if self.value < 0:
            raise ValueError("value must be >= 0")
        object.__setattr__(self, "twice", 2 * self.value)


def test_a_class_with_post_init_goes_through_replace():
    """Its ``__post_init__`` checks and derives: the fast path would skip both."""
    assert evolve(Checked(1), value=4) == Checked(4) == replace(Checked(1), value=4)
    assert evolve(Checked(1), value=4).twice == 8
    with pytest.raises(ValueError, match="value must be >= 0"):
        evolve(Checked(1), value=-1)
    assert not isinstance(_COPIERS[Checked], _Copier)
