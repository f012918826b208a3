"""When a situation that was escalated before is raised again (router.held_back)."""

from __future__ import annotations

import pytest

from escalation.router import held_back

WINDOW = 3600.0


@pytest.mark.parametrize("kind", ["unmatched", "approval"])
@pytest.mark.parametrize("status", ["pending", "approved"])
def test_waiting_on_people_or_about_to_run_holds_it_back_however_old(
    status: str, kind: str
) -> None:
    assert held_back(status, kind, 0.0, 10 * WINDOW, WINDOW)


@pytest.mark.parametrize("kind", ["unmatched", "approval"])
@pytest.mark.parametrize("status", ["expired", "denied"])
def test_unanswered_or_refused_holds_it_back_for_the_window(status: str, kind: str) -> None:
    assert held_back(status, kind, 0.0, WINDOW - 1, WINDOW)
    assert not held_back(status, kind, 0.0, WINDOW, WINDOW)


@pytest.mark.parametrize("kind", ["unmatched", "sensing_failure", "approval"])
def test_a_situation_that_cleared_and_comes_back_is_new(kind: str) -> None:
    assert not held_back("resolved", kind, 0.0, 60.0, WINDOW)


@pytest.mark.parametrize("status", ["executed", "vetoed", "failed", "void"])
def test_an_answer_that_was_acted_on_gets_a_window_to_take_effect(status: str) -> None:
    assert held_back(status, "unmatched", 0.0, 60.0, WINDOW)
    assert not held_back(status, "unmatched", 0.0, WINDOW, WINDOW)


@pytest.mark.parametrize("status", ["executed", "vetoed", "failed", "void"])
def test_asking_to_approve_an_action_again_after_the_last_one_was_acted_on_is_new(
    status: str,
) -> None:
    assert not held_back(status, "approval", 0.0, 60.0, WINDOW)
