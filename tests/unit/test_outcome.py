"""The report says plainly why the winner is the baseline, from the proposal counts."""

from __future__ import annotations

from search.outcome import ProposalOutcome, never_admitted, outcome_line

BASELINE = [{"id": "b", "author": "baseline"}]
FOUND = [{"id": "v", "author": "agent-0"}, *BASELINE]


def _kernel(lineage, outcome):
    return {"kernel": "k", "lineage": lineage, "proposals": outcome and outcome.to_dict()}


def test_a_baseline_winner_is_explained_and_a_real_winner_is_not():
    none_ran = ProposalOutcome(proposals=4, failed=3, admitted=0, reasons=("3 x planner: timeout",))
    some_ran = ProposalOutcome(proposals=4, failed=0, admitted=4, correct=2)
    assert outcome_line(_kernel(BASELINE, none_ran)).startswith("NO PROPOSAL ADMITTED: none of 4 proposal(s)")
    assert "3 x planner: timeout" in outcome_line(_kernel(BASELINE, none_ran))
    assert outcome_line(_kernel(BASELINE, some_ran)).startswith("NO IMPROVEMENT: 4 proposal(s) ran, 2 correct")
    assert outcome_line(_kernel(FOUND, some_ran)) == ""


def test_only_kernels_with_no_admitted_proposal_fail_the_run():
    summary = {"kernels": [_kernel(BASELINE, ProposalOutcome(proposals=2, failed=2)) | {"kernel": "a"},
                           _kernel(BASELINE, ProposalOutcome(proposals=2, admitted=1)) | {"kernel": "b"},
                           _kernel(BASELINE, None) | {"kernel": "old"}]}
    assert never_admitted(summary) == ["a"]
