"""One sandbox per conversation: each thread_id gets the same sandbox every
time (started again if it was stopped by its idle timeout), so files and
installed packages persist across the turns of a chat, and nothing else.

    berth serve &
    pip install ./sdk/python
    python examples/sandbox_per_thread.py conv-42 "echo hello > notes.txt"
    python examples/sandbox_per_thread.py conv-42 "cat notes.txt"     # hello
    python examples/sandbox_per_thread.py conv-7  "cat notes.txt"     # no such file
"""

from __future__ import annotations

import sys

from berth import Berth


def run_in_thread(thread_id: str, command: str) -> str:
    with Berth() as client:
        # Atomic: concurrent calls for one thread_id get one sandbox. Stopped
        # after 15 idle minutes (files kept), deleted after 7 idle days.
        sb = client.get_or_create({"thread_id": thread_id}, idle_timeout=15 * 60, delete_after=7 * 24 * 3600)
        r = sb.exec(command, timeout=60)
        return f"[{sb.id} exit {r.exit_code}]\n{r.stdout}{r.stderr}"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(run_in_thread(sys.argv[1], sys.argv[2]))
