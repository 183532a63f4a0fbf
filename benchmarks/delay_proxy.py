"""A TCP proxy on 127.0.0.1 that adds a round-trip time to every request (for kernels without netem).

    python benchmarks/delay_proxy.py --target 127.0.0.1:9000 --rtt-ms 25 [--port 0]

Prints the port it listens on, then forwards each connection to the target. Bytes from the client are held for
the whole round trip before they go on (a request reaches the server rtt after it was sent); bytes back are
forwarded at once. So every request/response exchange costs one extra rtt, and bandwidth is not limited (the
server's answer streams as fast as it is produced), which is how a distant object store looks to a client with
keep-alive connections. A new connection's handshake is not delayed (clients keep their connections).

Each connection uses two threads: one reads the client and queues what it read with its due time, one sends the
queue on to the server when due; the server's bytes are copied back by a third.
"""

from __future__ import annotations

import argparse
import collections
import socket
import sys
import threading
import time


def _pipe_back(src: socket.socket, dst: socket.socket) -> None:
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    try:
        while True:
            n = src.recv_into(buf)
            if not n:
                break
            dst.sendall(view[:n])
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _delayed(src: socket.socket, dst: socket.socket, delay: float) -> None:
    q: collections.deque = collections.deque()
    ready = threading.Condition()
    done = [False]

    def sender() -> None:
        try:
            while True:
                with ready:
                    while not q and not done[0]:
                        ready.wait()
                    if not q:
                        break
                    due, data = q.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            with ready:
                q.append((time.monotonic() + delay, data))
                ready.notify()
    except OSError:
        pass
    finally:
        with ready:
            done[0] = True
            ready.notify()


def serve(target: tuple[str, int], rtt_s: float, port: int = 0, ready: threading.Event | None = None,
          port_out: list | None = None) -> None:
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", port))
    lsock.listen(512)
    if port_out is not None:
        port_out.append(lsock.getsockname()[1])
    print(lsock.getsockname()[1], flush=True)
    if ready is not None:
        ready.set()
    while True:
        client, _ = lsock.accept()
        server = socket.create_connection(target)
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_delayed, args=(client, server, rtt_s), daemon=True).start()
        threading.Thread(target=_pipe_back, args=(server, client), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="host:port of the server, e.g. 127.0.0.1:9000")
    p.add_argument("--rtt-ms", type=float, required=True, help="round trip added to every request, ms")
    p.add_argument("--port", type=int, default=0, help="port to listen on, 127.0.0.1 (default: a free one)")
    a = p.parse_args(argv)
    host, _, port = a.target.rpartition(":")
    serve((host, int(port)), a.rtt_ms / 1e3, a.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
