"""Every socket grpokit listens on is bound where its config says, loopback by default: checked on the
kernel's table of this process's listening sockets (the bound addresses, not the default value of a
`host` parameter), and by connecting through this machine's non-loopback address, which must be refused.
Covered: `grpokit infer`'s HTTP server, NCCLBroadcast's rendezvous (TCPStore) with gloo's sockets, and
ZMQTransport's trainer socket."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time

import pytest
import torch

from grpokit.broadcast.nccl import NCCLBroadcast
from grpokit.testing import free_port
from grpokit.transport.zmq import ZMQTransport
from grpokit.types import WeightUpdate
from tests.support import serving

LOOPBACK = ("127.0.0.1", "::1")
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc/net/tcp")


def listening() -> set[tuple[str, int]]:
    """(address, port) of every TCP socket this process listens on, from /proc/net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    address, port = cols[1].split(":")
                    found.add((decode(address), int(port, 16)))
    return found


def decode(hex_address: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def outside_address() -> str | None:
    """This machine's address on its default route (not loopback), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.255", 9))  # no packet is sent: this only picks the route
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address


def assert_unreachable_from_outside(port: int) -> None:
    address = outside_address()
    if address is None:
        return  # no second interface: the bound address checked above is the whole test
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address, port), timeout=5).close()


def test_the_inference_server_listens_on_loopback_only(tiny_model):
    before = listening()
    with serving(tiny_model) as (_, server):
        port = server.server_address[1]
        opened = listening() - before
        assert opened == {("127.0.0.1", port)}
        assert_unreachable_from_outside(port)


def test_the_nccl_rendezvous_and_gloo_listen_on_loopback_only():
    """TCPStore alone listens on every interface whatever its host; NCCLBroadcast hands it a socket bound
    to `host`. gloo's own listening sockets (one per pair) are bound to the loopback host too."""
    before, port = listening(), free_port()
    trainer, engine = NCCLBroadcast(port=port, backend="gloo", timeout=30), NCCLBroadcast(port=port, backend="gloo")
    publisher = threading.Thread(target=trainer.publish, args=(WeightUpdate(step=0, tensors={"w": torch.ones(3)}),))
    publisher.start()  # blocks until the engine joins
    try:
        deadline = time.monotonic() + 30
        while engine.poll(-1) is None:
            assert time.monotonic() < deadline, "the engine received nothing"
            time.sleep(0.01)
        publisher.join(30)
        opened = listening() - before
        assert ("127.0.0.1", port) in opened and all(address in LOOPBACK for address, _ in opened), opened
        assert_unreachable_from_outside(port)
    finally:
        trainer.close()
        engine.close()


def test_the_zmq_transport_listens_on_loopback_only():
    before, port = listening(), free_port()
    trainer = ZMQTransport(port=port)
    try:
        with pytest.raises(TimeoutError):
            trainer.receive(0, timeout=0.2)  # binds, then waits for a batch that never comes
        assert listening() - before == {("127.0.0.1", port)}
        assert_unreachable_from_outside(port)
    finally:
        trainer.close()


def test_a_port_in_use_names_the_settings():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        broadcast = NCCLBroadcast(port=taken.getsockname()[1], backend="gloo", timeout=5)
        with pytest.raises(OSError, match=r"cannot listen on 127.0.0.1:\d+ \(broadcast.init_args.host, .*port\)"):
            broadcast.publish(WeightUpdate(step=0, tensors={}))
