"""How a simulated server fails: the faults a test injects (`--sim-faults`, config.Faults) and
the one real failure it reproduces, a token id outside the vocabulary.

Kept apart from the HTTP handlers because a failure must look like SGLang's from outside — an
error status, a reset connection, a hang, or the whole process gone with SGLang's last lines in
its log — whichever endpoint it strikes.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from infra.sim.config import Faults
from infra.sim.startup import log


class Failures:
    def __init__(self, faults: Faults, seed: int, vocab_size: int | None) -> None:
        self.faults = faults
        self.rng = random.Random(seed)
        self.vocab_size = vocab_size
        self.completed = 0

    async def maybe_fault(self, request: Request) -> Response | None:
        f = self.faults
        roll = self.rng.random()
        if roll < f.error_rate:
            return JSONResponse({"error": {"message": "simulated internal error"}},
                                status_code=500)
        if roll < f.error_rate + f.reset_rate:
            reset_connection(request)
            await asyncio.sleep(3600)  # the connection is gone; nothing will be sent
        if roll < f.error_rate + f.reset_rate + f.hang_rate:
            await asyncio.sleep(3600)
        return None

    def die_on_unknown_token(self, prompt: list[int]) -> None:
        """Real SGLang 0.5.17 does not check token ids: one at or above the vocabulary indexes
        past the embedding table on the GPU, the scheduler dies and takes the server with it
        (every request in flight is lost). So does the simulator."""
        if self.vocab_size is None:
            return
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            log("Scheduler hit an exception: RuntimeError: CUDA error: device-side assert "
                f"triggered (input id {bad}, vocab_size {self.vocab_size}: "
                "indexSelectLargeIndex: srcIndex < srcSelectDimSize failed)")
            log("Received sigquit from a child process. It usually means the child failed.")
            os._exit(1)

    def die_on_poison(self, prompt: str) -> None:
        """The fault `crash_on_text`: the scheduler dies on this prompt, as on a bad id."""
        poison = self.faults.crash_on_text
        if poison is not None and poison in prompt:
            log("Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory "
                "access was encountered (fault injection: crash_on_text)")
            log("Received sigquit from a child process. It usually means the child failed.")
            os._exit(1)

    def after_completion(self) -> None:
        self.completed += 1
        limit = self.faults.crash_after_requests
        if limit is not None and self.completed >= limit:
            log("Scheduler hit an exception: simulated crash (fault injection)")
            os._exit(1)


def reset_connection(request: Request) -> None:
    """Abort the TCP connection with a RST (SO_LINGER 0), as a crashing peer would.

    Reaches uvicorn's transport through the ASGI receive callable (its request cycle)."""
    cycle = getattr(getattr(request, "_receive", None), "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        raise ConnectionResetError("simulated connection reset")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
