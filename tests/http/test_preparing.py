"""The front end's count of generation requests it is preparing (`arrival.Preparing`): a
request holds a place from its arrival to its hand-over to the engine (`Arrival.hand_over` in
`submit`, which tells the engine how many are still behind it) or to its end, whichever comes
first, so a failed or refused request never leaves one behind."""
from __future__ import annotations

from fake_engine import FakeEngine
from ninfer_engine.arrival import current_arrival
from ninfer_http.observers import PREPARING


class HandingOver(FakeEngine):
    """Hands each request over as the engines do, noting the count before and after."""

    def __init__(self) -> None:
        super().__init__()
        self.preparing = None
        self.seen: list[tuple[int, int]] = []

    def submit(self, request):
        before = self.preparing.count
        self.seen.append((before, current_arrival().hand_over()))
        return super().submit(request)


def test_a_request_holds_a_place_until_its_hand_over_or_its_end(serve):
    engine = HandingOver()
    live = serve(engine)
    preparing = engine.preparing = live.server.runner.app[PREPARING]
    assert live.chat().status == 200 and live.chat(stream=True).status == 200
    assert engine.seen == [(1, 0), (1, 0)] and preparing.count == 0
    assert live.chat(messages=[]).status == 400  # refused while preparing: its place freed
    assert live.request("POST", "/v1/messages", b"{not json").status == 400
    assert live.request("GET", "/v1/models").status == 200  # not a generation: never counted
    assert preparing.count == 0 and len(engine.seen) == 2
