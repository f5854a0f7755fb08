#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_tcp_frame (tests/fuzz/corpus/tcp_frame/). Input format (see
fuzz_tcp_frame.cpp): byte 0 = socket count - 1; then records [control][1-64 bytes], control =
socket | (length - 1) << 2. Frames as in transports/tcp/tcp_frame.hpp (little-endian host)."""
import os
import struct
import sys

MAGIC = 0x31544652


def header(kind, socket, region, value, offset, length):
    return struct.pack("<IBBHIIQQ", MAGIC, kind, socket, 0, region, value, offset, length)


def write(socket, region, offset, payload):
    return header(1, socket, region, 0, offset, len(payload)) + payload


def signal(region, offset, value, writes_before):
    wb = list(writes_before) + [0] * (8 - len(writes_before))
    return header(2, 0, region, value, offset, 0) + struct.pack("<8I", *wb)


def records(streams, piece):
    """Interleaves per-socket byte streams into records of `piece` bytes, round-robin."""
    out = bytearray()
    pos = [0] * len(streams)
    while any(pos[s] < len(streams[s]) for s in range(len(streams))):
        for s, data in enumerate(streams):
            if pos[s] < len(data):
                chunk = data[pos[s]:pos[s] + piece]
                pos[s] += len(chunk)
                out.append(s | (len(chunk) - 1) << 2)
                out += chunk
    return bytes(out)


def seed(streams, piece=64):
    return bytes([len(streams) - 1]) + records(streams, piece)


seeds = {
    # one socket: a write, then the signal that follows it
    "write_signal": seed([write(0, 0, 16, bytes(range(100))) + signal(1, 0, 1, [1])]),
    # two sockets: the signal (socket 0) arrives before the write it follows (socket 1)
    "signal_first": seed([signal(1, 64, 7, [0, 1]), write(1, 0, 0, b"x" * 64)], piece=9),
    # empty writes, into a region and into the empty region 3, then a signal
    "empty_writes": seed([write(0, 3, 0, b"") + write(0, 0, 256, b"") + signal(1, 0, 2, [2])]),
    # three sockets, a striped write in small pieces, then the signal
    "striped": seed([write(0, 0, 0, b"a" * 80) + signal(1, 0, 3, [1, 1, 1]),
                     write(1, 0, 80, b"b" * 80), write(2, 0, 160, b"c" * 96)], piece=7),
    # malformed: a write past its region's end
    "out_of_bounds": seed([write(0, 0, 200, b"z" * 100)]),
    # malformed: a signal into a deregistered region
    "dead_region": seed([signal(2, 0, 1, [0])]),
}
out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "tcp_frame")
os.makedirs(out_dir, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out_dir, name), "wb") as f:
        f.write(data)
