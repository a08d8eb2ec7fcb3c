"""Issue 14 item 1: a rank that skips a call, or whose call failed its input checks before
launching, must not leave the epochs out of step with every later call silently wrong. The
call's sequence number is taken before the checks, so the next call on the failing rank
carries the next number: its peers see another call's tag at the same epoch and every rank
raises CollectiveMismatch; then every later call raises CommunicatorBroken."""
from __future__ import annotations

import pytest

from fault_harness import BAD, SKIP, Step, first_errors, run_case, statuses

LL = [Step("ar", n) for n in (512, 1024, 768, 1536, 640)]            # 1-3 KiB: the LL path
ONE_STAGE = [Step("fused", rows) for rows in (4, 6, 5, 4)]           # fused_1stage at TP2
TWO_STAGE = [Step("fused", rows, path="fused_2stage") for rows in (2, 3, 2, 4)]


@pytest.mark.parametrize("case,tp,steps", [("ll", 2, LL), ("fused_1stage", 2, ONE_STAGE),
                                           ("fused_2stage", 4, TWO_STAGE)])
def test_a_rank_that_skips_a_call(case, tp, steps):
    res = run_case(f"skip a call ({case}, TP{tp})", tp, steps, {(1, 1): SKIP})
    st = statuses(res)
    assert all(s[0] == "exact" for s in st)                # before the skip: exact
    assert first_errors(res) == ["CollectiveMismatch"] * tp, st
    assert st[0][1] == "CollectiveMismatch" and st[1][1] == "CollectiveMismatch"
    assert all(s[-1] == "CommunicatorBroken" for s in st)


def test_a_rank_that_skips_a_fused_ll_call():
    """The ll+rmsnorm path in one launch (sm_90's fused_ar_rms_ll): its LL lines carry the
    call's tag as the LL all-reduce's do."""
    steps = [Step("fused", rows, path="ll+rmsnorm") for rows in (4, 6, 5, 4)]
    res = run_case("skip a call (fused LL, sm_90, TP2)", 2, steps, {(1, 1): SKIP},
                   target="sm_90", ll_max_bytes=1 << 16)
    st = statuses(res)
    assert all(s[0] == "exact" for s in st)
    assert first_errors(res) == ["CollectiveMismatch"] * 2, st
    assert all(s[-1] == "CommunicatorBroken" for s in st)


@pytest.mark.parametrize("case,steps", [("ll", [Step("ar", 1024)] * 4),
                                        ("fused_1stage", [Step("fused", 4)] * 4)])
def test_a_call_that_failed_its_checks_on_one_rank(case, steps):
    """Identical calls: only the sequence number tells rank 0's second call from rank 1's
    third, which is what the peers compare."""
    res = run_case(f"input check failed on one rank ({case})", 2, steps, {(1, 1): BAD})
    assert statuses(res) == [
        ["exact", "CollectiveMismatch", "CommunicatorBroken", "CommunicatorBroken"],
        ["exact", "bad input", "CollectiveMismatch", "CommunicatorBroken"]]


def test_a_check_that_fails_on_every_rank_breaks_nothing():
    """Every rank refused the same input: nobody launched, every rank used the number, and
    the next call agrees (a bad input is not a collective error)."""
    res = run_case("input check failed on every rank", 2, [Step("ar", 1024)] * 3,
                   {(0, 1): BAD, (1, 1): BAD})
    assert statuses(res) == [["exact", "bad input", "exact"]] * 2


def test_a_skip_is_named_a_mismatch_while_another_peer_is_still_late():
    """TP4 LL, rank 3 skips a call while rank 1 comes late (well within the spin limit): a
    rank that sees rank 3's other tag before rank 1's line has landed must name the mismatch
    (the evidence), not a timeout on rank 1 (which was merely late)."""
    def before(comm, i):
        comm.delay = 1500 if (comm.rank, i) == (1, 1) else 0
    res = run_case("skip a call while a peer is late (ll, TP4)", 4, LL, {(3, 1): SKIP},
                   before=before)
    st = statuses(res)
    assert all(s[0] == "exact" for s in st)
    assert all(f in ("CollectiveMismatch", "CollectiveAborted") for f in first_errors(res)), st
    assert "CollectiveMismatch" in first_errors(res), st
