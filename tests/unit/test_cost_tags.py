"""Cost-allocation tags: the policy's ``tags:`` checked at FILE:LINE:COL by every cloud's rules,
and each launch tagged with ``burst:project`` and, for one user's work, ``burst:user``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.domain.plan import Launch
from orchestrator.planner import plan
from orchestrator.policy import PolicyError, load_policy, load_policy_text
from orchestrator.policy.tags import PROJECT_TAG, USER_TAG, cost_tags, tag_problems
from tests.builders import T0, make_job, make_policy, make_snapshot

ROOT = Path(__file__).resolve().parents[2]
GCP_EXAMPLE = ROOT / "policies" / "examples" / "gcp-a100.yaml"
AWS_EXAMPLE = ROOT / "policies" / "examples" / "aws-spot-fallback.yaml"


def with_tags(example: Path, tags_yaml: str) -> str:
    text = example.read_text()
    text = re.sub(r"^tags:\n(  .*\n)*", "", text, flags=re.MULTILINE)  # the example's own
    return text + "tags:\n" + tags_yaml


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "pool.yaml")
    return [str(p) for p in caught.value.problems]


def test_the_examples_carry_tags_that_every_cloud_accepts():
    assert load_policy(GCP_EXAMPLE).tags and load_policy(AWS_EXAMPLE).tags


@pytest.mark.parametrize(("example", "tags_yaml", "expected"), [
    (GCP_EXAMPLE, "  CostCenter: cc-42\n", r"tags\.CostCenter: GCP label key 'CostCenter'"),
    (GCP_EXAMPLE, "  team: ML Research\n", r"tags\.team: GCP label value 'ML Research'"),
    (GCP_EXAMPLE, "  team: " + "a" * 64 + "\n", r"tags\.team: GCP label value"),
    (AWS_EXAMPLE, "  burst:project: x\n", r"tags\.burst:project: 'burst:project' is reserved"),
    (AWS_EXAMPLE, "  aws:createdBy: x\n", r"is reserved"),
    (AWS_EXAMPLE, "  team: ml;drop\n", r"tags\.team: AWS tag value 'ml;drop'"),
    (AWS_EXAMPLE, "  team: 7\n", r"tags\.team: .*string"),
])
def test_a_bad_tag_is_an_error_at_its_line_and_column(example, tags_yaml, expected):
    text = with_tags(example, tags_yaml)
    line = text.count("\n", 0, text.index("tags:\n")) + 2  # the tag's own line
    [problem] = problems(text)
    assert re.search(expected, problem), problem
    assert re.match(rf"^pool\.yaml:{line}:\d+: ", problem), problem


def test_aws_only_policies_may_use_aws_spellings():
    policy = load_policy_text(with_tags(AWS_EXAMPLE, "  CostCenter: CC 42/gpu\n  Team: ML\n"))
    assert policy.tags == {"CostCenter": "CC 42/gpu", "Team": "ML"}


def test_too_many_tags_for_the_cloud_are_refused_naming_the_room_left():
    many = "".join(f"  t{i}: v\n" for i in range(43))
    [problem] = problems(with_tags(AWS_EXAMPLE, many))
    assert "43 tags: at most 42 (AWS allows 50 tags an instance and burst's own take 8)" in problem


label_text = st.from_regex(r"[a-z][a-z0-9_-]{0,62}", fullmatch=True)


@given(st.dictionaries(label_text, st.from_regex(r"[a-z0-9_-]{0,63}", fullmatch=True),
                       max_size=10))
def test_what_gcp_accepts_aws_accepts_too(tags):
    tags = {k: v for k, v in tags.items() if not k.startswith("burst")}
    assert tag_problems(tags, gcp=True) == [] and tag_problems(tags, gcp=False) == []


@given(st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=20), max_size=5))
def test_every_problem_names_a_key_of_the_map_or_the_map(tags):
    for key, message in tag_problems(tags, gcp=True):
        assert key is None or key in tags
        assert message


def test_cost_tags_add_project_and_user_to_the_policys_own():
    assert cost_tags({"team": "ml"}, "research", "ada") == {
        "team": "ml", PROJECT_TAG: "research", USER_TAG: "ada"}
    assert cost_tags({}, None, None) == {}


def _launches(jobs) -> list[Launch]:
    result = plan(make_snapshot(jobs, taken_at=T0), [make_policy()], T0)
    return [a for a in result.actions if isinstance(a, Launch)]


def test_a_node_for_one_users_work_names_the_user_and_shared_nodes_do_not():
    [alone] = _launches([make_job("j1", gpus=8, user="ada")])
    assert alone.user == "ada" and alone.jobs == ("j1",)
    shared = _launches([make_job("j1", gpus=4, user="ada"), make_job("j2", gpus=4, user="bob")])
    assert [launch.user for launch in shared] == [None]  # two users' jobs on one 8-GPU node
    [unknown] = _launches([make_job("j1", gpus=8)])
    assert unknown.user is None
