"""A stand-in for the sandbox worker's process (``python -m tests.unit.env_echo_worker --fd N
--device D``): it speaks the worker's start-up protocol and answers "ready" with the
environment the kernel gave it (``/proc/self/environ``), so a CPU test can see what a
candidate's process would see."""

from __future__ import annotations

import argparse
from multiprocessing.connection import Connection
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    conn = Connection(args.fd)
    conn.send(("ready", {"environ": Path("/proc/self/environ").read_bytes(), "device": args.device}))
    conn.recv()  # until the parent closes or sends None


if __name__ == "__main__":
    main()
