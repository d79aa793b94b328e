"""Which servers an asymmetric fleet restarts alone, and when the watch asks for it."""

from __future__ import annotations

from tasks.tuning.diagnosis import Diagnosis, ServerWindow
from tasks.tuning.watch import RegressionWatch


def window(name: str, tok: float) -> ServerWindow:
    return ServerWindow(name, True, 30, 1, 0.2, 0.3, tok)


def test_slow_servers_are_those_under_three_quarters_of_the_median() -> None:
    from flows.repair import slow_servers
    diag = Diagnosis("asymmetric", "", 400.0, [window("server-0", 500), window("server-1", 480),
                                               window("server-2", 175)])
    assert slow_servers(diag) == [("server-2", 175, 480)]
    assert slow_servers(Diagnosis("asymmetric", "", 1.0, [window("server-0", 1.0)])) == []


class _Monitor:
    def now(self) -> float:
        return 0.0


def test_the_watch_asks_after_two_asymmetric_checks_in_a_row() -> None:
    watch = RegressionWatch(_Monitor(), {}, None, 1.0, 4.0, None, None, None,  # type: ignore[arg-type]
                            enabled=True)
    asked: list[Diagnosis] = []

    def ask(diag: Diagnosis) -> bool:
        asked.append(diag)
        return True

    watch.on_asymmetric = ask
    odd = Diagnosis("asymmetric", "", 1.0)
    fine = Diagnosis("compute-bound", "", 1.0)
    assert not watch._repaired(odd)
    assert not watch._repaired(fine)  # the run of asymmetric checks is broken
    assert not watch._repaired(odd)
    assert watch._repaired(odd) and asked == [odd]
    assert not watch._repaired(odd)  # counting starts again after a repair
