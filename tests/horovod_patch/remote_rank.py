"""A rank started through the patched runner's remote command (tests/test_horovod_patch.py): says how many of the
COUNT variables HST_i it got right (each `line {i}` and a quote, a newline and a non-ASCII letter), its secret, HOME
and what its stdin held, then holds for SECONDS (writing its pid to PID_FILE first) and exits with STATUS.

    python remote_rank.py COUNT STATUS SECONDS PID_FILE
"""

import os
import sys
import time


def expected(index: int) -> str:
    return f'line {index} it\'s "q"\nsecond line é'


def main() -> int:
    count, status, seconds, pid_file = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    right = sum(os.environ.get(f"HST_{i}") == expected(i) for i in range(count))
    stdin = sys.stdin.read()
    print(f"{right} of {count} right; API_KEY {os.environ.get('API_KEY')}; HOME {os.environ.get('HOME')}; "
          f"stdin {stdin!r}", flush=True)  # fmt: skip
    with open(pid_file, "w") as out:
        out.write(str(os.getpid()))
    time.sleep(seconds)
    return status


if __name__ == "__main__":
    sys.exit(main())
