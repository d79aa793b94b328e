"""Which servers an asymmetric fleet restarts alone, and when the watch asks for it."""

from __future__ import annotations

from tasks.tuning.diagnosis import Diagnosis, ServerWindow, slow_servers
from tasks.tuning.watch import RegressionWatch, WatchTargets


def window(name: str, tok: float) -> ServerWindow:
    return ServerWindow(name, True, 30, 1, 0.2, 0.3, tok)


def test_slow_servers_are_those_under_three_quarters_of_the_median() -> None:
    diag = Diagnosis("asymmetric", "", 400.0, [window("server-0", 500), window("server-1", 480),
                                               window("server-2", 175)])
    assert slow_servers(diag) == [("server-2", 175, 480)]
    assert slow_servers(Diagnosis("asymmetric", "", 1.0, [window("server-0", 1.0)])) == []


class _Monitor:
    def now(self) -> float:
        return 0.0


def test_the_watch_asks_only_when_one_server_stays_slow_for_two_windows() -> None:
    """Window 4 s, a check a second: 8 checks in a row. A fleet whose slow server changes
    from check to check (staggered restarts, waves of long requests) is never repaired."""
    watch = RegressionWatch(_Monitor(), WatchTargets({}, None, window_s=4.0),  # type: ignore[arg-type]
                            enabled=True)
    asked: list[Diagnosis] = []

    def ask(diag: Diagnosis) -> bool:
        asked.append(diag)
        return True

    watch.on_asymmetric = ask

    def odd(slow: str) -> Diagnosis:
        return Diagnosis("asymmetric", "", 1.0, [
            window(n, 100 if n == slow else 500) for n in ("server-0", "server-1", "server-2")])

    for k in range(20):  # the slow one moves around: never 8 in a row
        assert not watch._repaired(odd(f"server-{k % 3}"))
    for _ in range(7):
        assert not watch._repaired(odd("server-2"))
    assert not watch._repaired(Diagnosis("compute-bound", "", 1.0))  # broken: start again
    for _ in range(7):
        assert not watch._repaired(odd("server-2"))
    assert watch._repaired(odd("server-2")) and len(asked) == 1
    assert not watch._repaired(odd("server-2"))  # counting starts again after a repair
