"""What makes a tick's decision a repeat of the last: elapsed seconds in the summary do not count."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from orchestrator.domain import Rule
from orchestrator.domain.plan import Decision
from orchestrator.store.codec import decision_fingerprint

AT = datetime(2026, 12, 2, tzinfo=UTC)
BASE = Decision(id="d-1", policy="p", at=AT, rule=Rule.TRIGGER_NOT_MET,
                summary="8 unmet GPU(s), but pending GPUs beyond on-prem 8 <= 16 all oldest "
                        "wait 42s <= 600s")


def test_a_growing_wait_is_the_same_decision():
    later = replace(BASE, id="d-2", summary=BASE.summary.replace("42s", "52.5s"))
    assert later.same_as(BASE)
    assert decision_fingerprint(later) == decision_fingerprint(BASE)


def test_other_figures_make_a_new_decision():
    for changed in (replace(BASE, summary=BASE.summary.replace("8 unmet", "16 unmet")),
                    replace(BASE, rule=Rule.SUSTAINING),
                    replace(BASE, held_back_by=("limits.max_nodes",)),
                    replace(BASE, chosen="aws/us-east-1/-/p5.48xlarge/spot"),
                    replace(BASE, summary=BASE.summary + "; 4s3 jobs")):
        assert not changed.same_as(BASE)
        assert decision_fingerprint(changed) != decision_fingerprint(BASE)
