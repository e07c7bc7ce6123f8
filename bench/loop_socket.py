"""The transport's socket layer alone: pyzmq's asyncio sockets against common/loop_socket.py, A B A B.

One process, one uvloop: a ROUTER echoes every frame to a DEALER that keeps ``--in-flight`` requests outstanding,
both written the way common/transport.py uses them (an awaited receive, then a drain of what is queued; sends that
do not wait). CPU (process time) per round trip, two sends and two receives, and round trips per second.

    python -m bench.loop_socket [--round-trips 20000] [--in-flight 64] [--pairs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any, Callable

import uvloop
import zmq
import zmq.asyncio

from bench.lib.results import RESULTS, conditions, finish, write_result
from common.loop_socket import LoopSocket

PAYLOAD = b"x" * 200  # a small message, about a Tokens frame


def _drain(recv: Callable[..., Any], into: list) -> None:
    while True:
        try:
            into.append(recv(zmq.NOBLOCK))
        except zmq.Again:
            return


async def _run(mode: str, num: int, in_flight: int) -> dict[str, Any]:
    ctx = zmq.asyncio.Context()
    server = ctx.socket(zmq.ROUTER)
    server.bind("tcp://127.0.0.1:0")
    client = ctx.socket(zmq.DEALER)
    client.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    loop = asyncio.get_running_loop()
    waiters: dict[bytes, asyncio.Future[bytes]] = {}
    if mode == "zmq.asyncio":
        s_plain, c_plain = zmq.Socket.shadow(server.underlying), zmq.Socket.shadow(client.underlying)
        s_recv, c_recv = server.recv_multipart, client.recv

        def s_send(frames: tuple) -> None:
            server.send_multipart(frames, flags=zmq.NOBLOCK)

        def c_send(data: bytes) -> None:
            client.send(data, flags=zmq.NOBLOCK)
    else:
        s_loop, c_loop = LoopSocket(server), LoopSocket(client)
        s_plain, c_plain = s_loop.sock, c_loop.sock
        s_recv, c_recv, s_send, c_send = s_loop.recv_multipart, c_loop.recv, s_loop.send_multipart_nowait, \
            c_loop.send_nowait

    async def echo() -> None:
        while True:
            frames = [await s_recv()]
            _drain(s_plain.recv_multipart, frames)
            for identity, data in frames:
                s_send((identity, data))

    async def reader() -> None:
        while True:
            msgs = [await c_recv()]
            _drain(c_plain.recv, msgs)
            for m in msgs:
                waiters.pop(m[:8]).set_result(m)

    counter = 0

    async def requester(n: int) -> None:
        nonlocal counter
        for _ in range(n):
            counter += 1
            key = counter.to_bytes(8, "little")
            fut = waiters[key] = loop.create_future()
            c_send(key + PAYLOAD)
            await fut

    tasks = [loop.create_task(echo()), loop.create_task(reader())]
    await asyncio.gather(*(requester(100) for _ in range(in_flight)))  # warm-up
    wall0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(requester(num // in_flight) for _ in range(in_flight)))
    wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if mode != "zmq.asyncio":
        s_loop.close()
        c_loop.close()
    ctx.destroy(linger=0)
    done = (num // in_flight) * in_flight
    return {"mode": mode, "round_trips": done, "round_trips_per_s": round(done / wall_s),
            "cpu_us_per_round_trip": round(cpu_s * 1e6 / done, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round-trips", type=int, default=20000)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "loop_socket.json")
    args = ap.parse_args()
    cond = conditions("loop_socket", round_trips=args.round_trips, in_flight=args.in_flight,
                      payload_bytes=len(PAYLOAD) + 8, transport="tcp loopback, one process, uvloop",
                      order="zmq.asyncio, loop_socket, repeated --pairs times")
    runs = []
    for _ in range(args.pairs):
        for mode in ("zmq.asyncio", "loop_socket"):
            runs.append(uvloop.run(_run(mode, args.round_trips, args.in_flight)))
            print(runs[-1], flush=True)
    finish(cond)
    write_result(args.out, {"conditions": cond, "runs": runs})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
