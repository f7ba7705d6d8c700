"""A stand-in sandbox worker for tests/unit/test_worker_stderr.py: it says ready, takes one job,
announces a step and then dies of SIGSEGV, as a library's segfault would end the real one."""

from __future__ import annotations

import argparse
import faulthandler
from multiprocessing.connection import Connection


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--gpu-turns")
    args = p.parse_args()
    conn = Connection(args.fd)
    conn.send(("ready", {"pid": 0}))
    conn.recv()
    conn.send(("beat", "call of peer flashinfer on [33, 32, 96]"))
    faulthandler._sigsegv()


if __name__ == "__main__":
    main()
