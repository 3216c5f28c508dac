"""The rule for which of a peer's addresses its data link takes (transport/address_choice.py)."""

from swarm.transport.address_choice import FAILURES_TO_DROP, SAMPLES, AddressChoice

SLOW, FAST, THIRD = "10.0.0.2", "10.0.1.2", "10.0.2.2"


def test_one_address_is_the_choice_whatever_happens():
    choice = AddressChoice((SLOW,))
    assert choice.chosen == SLOW and choice.order() == [SLOW]
    for _ in range(FAILURES_TO_DROP + 1):
        assert not choice.failed(SLOW)
    assert choice.chosen == SLOW and choice.order() == [SLOW]


def test_discovery_s_first_until_both_are_measured():
    choice = AddressChoice((SLOW, FAST))
    assert choice.chosen == SLOW
    assert not choice.measured(FAST, 0.0005)  # the chosen one is not measured yet: nothing to compare
    assert choice.measured(SLOW, 0.021)
    assert choice.chosen == FAST and choice.order() == [FAST, SLOW]


def test_a_switch_needs_a_clear_gain():
    choice = AddressChoice((SLOW, FAST))
    choice.measured(SLOW, 0.0100)
    assert not choice.measured(FAST, 0.0085)  # 1.5 ms but only 15 %
    assert choice.chosen == SLOW
    choice = AddressChoice((SLOW, FAST))
    choice.measured(SLOW, 0.0010)
    assert not choice.measured(FAST, 0.0004)  # 60 % but only 0.6 ms
    assert choice.chosen == SLOW
    assert choice.measured(FAST, 0.0004) is False and choice.measured(SLOW, 0.0030) is False  # least kept: 1 ms
    choice = AddressChoice((SLOW, FAST))
    choice.measured(SLOW, 0.0100)
    assert choice.measured(FAST, 0.0070)  # 3 ms and 30 %
    assert choice.chosen == FAST


def test_equal_paths_do_not_flap():
    choice = AddressChoice((SLOW, FAST))
    moves = 0
    for i in range(50):
        moves += choice.measured(SLOW, 0.0010 + (i % 3) * 0.0002)
        moves += choice.measured(FAST, 0.0010 + ((i + 1) % 3) * 0.0002)
    assert moves == 0 and choice.chosen == SLOW


def test_the_least_of_recent_samples_counts():
    choice = AddressChoice((SLOW, FAST))
    choice.measured(FAST, 0.001)
    for _ in range(SAMPLES - 1):
        choice.measured(FAST, 0.050)  # a loaded moment: the least stands
    assert choice.rtt(FAST) == 0.001
    choice.measured(FAST, 0.050)  # the fast sample aged out
    assert choice.rtt(FAST) == 0.050


def test_a_failing_chosen_address_falls_back_to_the_next_best_at_once():
    choice = AddressChoice((SLOW, FAST, THIRD))
    choice.measured(SLOW, 0.020)
    choice.measured(THIRD, 0.010)
    choice.measured(FAST, 0.001)
    assert choice.chosen == FAST
    for _ in range(FAILURES_TO_DROP - 1):
        assert not choice.failed(FAST)  # one lost probe is no cut
    assert choice.failed(FAST)
    assert choice.chosen == THIRD and choice.order() == [THIRD, SLOW, FAST]
    # Still faster on paper, but it does not answer: it stays out until it does.
    assert not choice.measured(SLOW, 0.020)
    assert choice.chosen == THIRD
    assert choice.measured(FAST, 0.001)  # it answers again, and is clearly faster
    assert choice.chosen == FAST


def test_unmeasured_addresses_come_after_measured_ones_in_discovery_order():
    choice = AddressChoice((SLOW, FAST, THIRD))
    choice.measured(SLOW, 0.002)
    choice.measured(THIRD, 0.0012)
    assert choice.chosen == SLOW  # (0.8 ms: no clear gain)
    assert choice.order() == [SLOW, THIRD, FAST]
    for _ in range(FAILURES_TO_DROP):
        choice.failed(SLOW)
    assert choice.chosen == THIRD


def test_addresses_that_go_away_are_forgotten():
    choice = AddressChoice((SLOW, FAST))
    choice.measured(SLOW, 0.02)
    choice.measured(FAST, 0.001)
    assert choice.chosen == FAST
    choice.update((SLOW,))
    assert choice.chosen == SLOW and choice.order() == [SLOW] and choice.rtt(FAST) is None
    assert not choice.measured(FAST, 0.001)  # not one of its addresses now
