"""E2B's own Python SDK (e2b, async API), unchanged, against berth.

The async client streams envd's WatchDir (the sync one polls a watcher),
so the two clients cover both of envd's ways to watch a directory.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import AsyncSandbox, CommandExitException, FilesystemEventType, PtySize, SandboxQuery


def run(coro):
    return asyncio.run(coro)


def test_async_commands_files_and_watch(berth_url: str) -> None:
    async def main() -> None:
        s = await AsyncSandbox.create(metadata={"suite": "async"}, envs={"A": "1"}, timeout=300)
        try:
            r = await s.commands.run("echo $A; echo e >&2")
            assert (r.stdout, r.stderr, r.exit_code) == ("1\n", "e\n", 0)
            with pytest.raises(CommandExitException) as e:
                await s.commands.run("exit 7")
            assert e.value.exit_code == 7

            chunks: list[str] = []
            h = await s.commands.run("for i in 1 2 3; do echo $i; sleep 0.1; done", background=True, on_stdout=chunks.append)
            res = await h.wait()
            assert res.stdout == "1\n2\n3\n" and "".join(chunks) == res.stdout

            h = await s.commands.run("cat", background=True, stdin=True)
            await s.commands.send_stdin(h.pid, "async stdin\n")
            await s.commands.close_stdin(h.pid)
            assert (await h.wait()).stdout == "async stdin\n"

            await s.files.make_dir("/home/user/w")
            events = []
            w = await s.files.watch_dir("/home/user/w", on_event=events.append)
            await s.files.write("/home/user/w/f.txt", "content")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(ev.name == "f.txt" for ev in events):
                await asyncio.sleep(0.1)
            await w.stop()
            assert any(ev.name == "f.txt" and ev.type in (FilesystemEventType.CREATE, FilesystemEventType.WRITE) for ev in events), events

            assert await s.files.read("/home/user/w/f.txt") == "content"
            entries = await s.files.list("/home/user/w")
            assert [x.name for x in entries] == ["f.txt"]
            await s.files.remove("/home/user/w/f.txt")
            assert not await s.files.exists("/home/user/w/f.txt")

            data = bytearray()
            t = await s.pty.create(PtySize(rows=30, cols=100), on_data=data.extend)
            await s.pty.send_stdin(t.pid, b"stty size; exit\n")
            await t.wait()
            assert b"30 100" in data

            found = await AsyncSandbox.list(query=SandboxQuery(metadata={"suite": "async"})).next_items()
            assert [i.sandbox_id for i in found] == [s.sandbox_id]
            await s.set_timeout(600)
            again = await AsyncSandbox.connect(s.sandbox_id)
            assert (await again.commands.run("echo again")).stdout == "again\n"
        finally:
            await s.kill()

    run(main())
