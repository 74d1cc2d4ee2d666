"""Terminals and interactive input through the SDK, against the session
daemon: a shell on a terminal (its size, a resize, Ctrl-C, a message the
daemon refuses, a detach and a reattach with the scrollback, the exit code),
a REPL fed by write_stdin and an attachment, the errors before anything
starts, the async client and the daemon's unix socket."""

from __future__ import annotations

import asyncio
import time

import pytest

from berth import (
    TTY,
    AsyncBerth,
    AsyncTerminal,
    Berth,
    Conflict,
    DaemonUnreachable,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    Sandbox,
    SandboxInfo,
    Terminal,
)

from conftest import Daemon


def until(term: Terminal, want: str, timeout: float = 15) -> str:
    """Read the terminal until its output (stdout and stderr) holds want; that output."""
    out = b""
    deadline = time.monotonic() + timeout
    while want.encode() not in out:
        left = deadline - time.monotonic()
        try:
            ev = term.recv(timeout=max(left, 0))
        except DeadlineExceeded:
            pytest.fail(f"no {want!r} after {timeout}s; output {out!r}")
        assert ev is not None, f"the attachment ended before {want!r}; output {out!r}"
        assert ev.type != "exit", f"exited ({ev.result}) before {want!r}; output {out!r}"
        out += ev.data
    return out.decode(errors="replace")


async def auntil(term: AsyncTerminal, want: str, timeout: float = 15) -> str:
    out = b""
    deadline = time.monotonic() + timeout
    while want.encode() not in out:
        ev = await term.recv(timeout=max(deadline - time.monotonic(), 0))
        assert ev is not None and ev.type != "exit", f"ended before {want!r}; output {out!r}"
        out += ev.data
    return out.decode(errors="replace")


def test_a_shell_on_a_terminal(client: Berth) -> None:
    with client.create() as sb:
        term = sb.open_terminal(["/bin/sh"], rows=30, cols=100)
        assert term.pid > 0 and term.tty == TTY(30, 100) == (30, 100)
        p = sb.get_process(term.pid)
        assert p.running and p.tty == (30, 100) and p.open_stdin and p.cmd == ["/bin/sh"]

        # The size, then a new one. (Patterns the echo of the command line lacks.)
        term.send("stty size; tty\n")
        assert "30 100" in until(term, "/dev/pts/")
        term.resize(40, 120)
        assert term.tty == (40, 120)
        term.send(b"stty size\n")
        until(term, "40 120")

        # Ctrl-C reaches the foreground program. (An interactive shell drops
        # the rest of a line ^C interrupted: $? is asked for on the next line.)
        term.send("sleep 100\n")
        time.sleep(0.3)  # let sleep start: a ^C before it would hit the shell's read
        term.send(b"\x03")
        term.send("echo x-$?\n")
        until(term, "x-130")

        # A size out of bounds is refused here; a message the daemon cannot
        # take comes back as an error event, and the terminal goes on.
        for rows, cols in ((0, 80), (24, 10001), (True, 80)):
            with pytest.raises(InvalidArgument):
                term.resize(rows, cols)
        assert term.tty == (40, 120)
        term._write('{"type":"dance"}')
        while (ev := term.recv(timeout=15)) is not None and ev.type != "error":
            pass
        assert ev is not None and isinstance(ev.error, InvalidArgument) and "dance" in ev.error.message
        term.send("echo still-$((20+1))\n")
        until(term, "still-21")

        # A detach leaves the shell running; a reattach shows the recent screen first.
        term.send("echo before-$((1+1))\n")
        until(term, "before-2")
        term.close()
        assert term.recv() is None and list(term) == []
        with pytest.raises(Conflict):
            term.send("echo nobody reads this\n")
        assert sb.get_process(term.pid).running
        with sb.attach(term.pid) as again:
            assert again.pid == term.pid and again.tty == (40, 120)
            scrollback = until(again, "before-2")
            assert "40 120" in scrollback and "x-130" in scrollback and "still-21" in scrollback

            # The exit code, with what came before it.
            again.send("echo last-$((2+2)); exit 3\n")
            res = again.wait(timeout=15)
            assert res.exit_code == 3 and res.pid == term.pid
            assert "last-4" in res.stdout and res.stderr_bytes == b""
            assert again.result is res and again.wait() is res
            assert again.recv() is None and list(again) == []
            with pytest.raises(Conflict):
                again.send("x")
        p = sb.get_process(term.pid)
        assert not p.running and p.result is not None and p.result.exit_code == 3


def test_the_default_shell_and_a_command(client: Berth) -> None:
    with client.create() as sb:
        with sb.open_terminal() as term:
            assert term.tty == (24, 80)
            term.send("echo shell=$0 size=$(stty size)\n")
            out = until(term, "size=24 80")
            assert "shell=-bash" in out or "shell=bash" in out, out
            # Ctrl-D once the shell is back at its prompt, as a person types it:
            # typed ahead, while the command still ran, it was once lost on
            # gvisor in CI (the shell never ended; why is not known yet).
            if "$ " not in out[out.index("size=24 80") :]:
                until(term, "$ ")
            term.send(b"\x04")  # Ctrl-D: the login shell ends
            assert term.wait(timeout=15).exit_code == 0

        # A string runs by /bin/sh -c, with cwd, user and env.
        with sb.open_terminal("echo $GREETING from $(pwd) as $(id -un); exit 7", cwd="/tmp", env={"GREETING": "hi"}) as term:
            res = term.wait(timeout=15)
        assert res.exit_code == 7 and "hi from /tmp as user" in res.stdout, res
        assert "\r\n" in res.stdout  # a terminal's output

        # wait gives up after its timeout and goes on where it stopped.
        with sb.open_terminal(["sh", "-c", "echo early; sleep 1; echo late"]) as term:
            with pytest.raises(DeadlineExceeded) as exc:
                term.wait(timeout=0.2)
            assert str(term.pid) in exc.value.message
            res = term.wait(timeout=15)
            assert res.exit_code == 0 and "early" in res.stdout and "late" in res.stdout

        # A process killed under an attachment: its exit comes, then the end.
        with sb.open_terminal(["sleep", "100"]) as term:
            sb.kill_process(term.pid)
            events = list(term)
            assert events[-1].type == "exit" and events[-1].result is not None
            assert events[-1].result.signal == 9 and events[-1].result.exit_code == 137


def test_interactive_stdin(client: Berth) -> None:
    with client.create() as sb:
        pid = sb.start_process(["python3", "-u", "-i", "-q"], open_stdin=True)
        p = sb.get_process(pid)
        assert p.open_stdin and p.tty is None and p.running
        assert pid in [q.pid for q in sb.list_processes()]
        sb.write_stdin(pid, "x = 6 * 7\n")
        with sb.attach(pid) as term:
            assert term.pid == pid and term.tty is None
            term.send(b"print(x)\n")
            until(term, "42")
            term.send("import sys; print('to-' + 'stderr', file=sys.stderr)\n")
            while (ev := term.recv(timeout=15)) is not None and b"to-stderr" not in ev.data:
                pass
            assert ev is not None and ev.type == "stderr"
            sb.write_stdin(pid, b"print('b' + 'ye')\n", close=True)
            res = term.wait(timeout=15)
        assert res.exit_code == 0 and "bye" in res.stdout, res
        assert sb.wait_process(pid, timeout=10).exit_code == 0

        # A closed input, an exited process, one that never had open input: conflict.
        with pytest.raises(Conflict):
            sb.write_stdin(pid, "x")
        other = sb.start_process(["sleep", "30"])
        with pytest.raises(Conflict) as exc:
            sb.write_stdin(other, "x")
        assert "stdin" in exc.value.message
        assert sb.get_process(other).open_stdin is False

        # EOF over an attachment: cat ends with what it read.
        cat = sb.start_process(["cat"], open_stdin=True)
        with sb.attach(cat) as term:
            term.send("hello\n")
            term.close_stdin()
            res = term.wait(timeout=15)
        assert res.exit_code == 0 and res.stdout == "hello\n"

        # A background process on a terminal, started without a WebSocket.
        tty = sb.start_process("read line; echo got-$line; stty size", tty=(12, 34))
        assert sb.get_process(tty).tty == TTY(12, 34)
        sb.write_stdin(tty, "it\n")
        with sb.attach(tty) as term:
            assert term.tty == (12, 34)
            res = term.wait(timeout=15)
        assert res.exit_code == 0 and "got-it" in res.stdout and "12 34" in res.stdout


def test_errors_before_anything_starts(client: Berth) -> None:
    with client.create() as sb:
        with pytest.raises(NotFound) as exc:
            sb.attach(99999)
        assert "99999" in exc.value.message
        for rows, cols in ((0, 80), (24, 20000)):
            with pytest.raises(InvalidArgument) as exc:
                sb.open_terminal(rows=rows, cols=cols)
            assert "tty" in exc.value.message
        with pytest.raises(InvalidArgument):
            sb.open_terminal(env={"": "x"})
        with pytest.raises(NotFound):
            Sandbox(client, SandboxInfo(id="sb-nosuchsandbox", state="")).open_terminal()
        sb.stop()
        with pytest.raises(Conflict):
            sb.open_terminal()
    with Berth("http://127.0.0.1:1") as nobody, pytest.raises(DaemonUnreachable):
        Sandbox(nobody, SandboxInfo(id="sb-x", state="")).attach(1)


def test_a_sandbox_deleted_under_a_terminal(client: Berth) -> None:
    sb = client.create()
    term = sb.open_terminal(["sleep", "100"])
    sb.delete()
    # The process dies with the sandbox and says so, or the attachment ends with the reason.
    events = []
    try:
        for ev in term:
            events.append(ev)
    except NotFound as e:
        # The daemon says why in an error event, then closes: that error ends the iteration.
        assert sb.id in e.message and "deleted" in e.message
        assert [ev.type for ev in events] == ["error"] and isinstance(events[0].error, NotFound)
    else:
        assert events[-1].type == "exit", events
    term.close()


def test_the_unix_socket(client: Berth, daemon: Daemon) -> None:
    with Berth(daemon.socket_url) as local, local.create() as sb:
        with sb.open_terminal(["sh", "-c", "echo via-$((40+2))"]) as term:
            res = term.wait(timeout=15)
        assert res.exit_code == 0 and "via-42" in res.stdout


def test_async_terminals(berth_url: str, daemon: Daemon) -> None:
    async def main(url: str) -> None:
        async with AsyncBerth(url) as c, await c.create() as sb:
            async with await sb.open_terminal(["/bin/sh"], rows=20, cols=60) as term:
                assert term.tty == (20, 60)
                await term.send("stty size\n")
                await auntil(term, "20 60")
                await term.resize(21, 61)
                await term.send(b"stty size\n")
                await auntil(term, "21 61")
                await term.send("exit 4\n")
                events = [ev async for ev in term]
                assert events[-1].type == "exit" and events[-1].result is not None
                assert events[-1].result.exit_code == 4 and term.result is not None

            pid = await sb.start_process(["python3", "-u", "-i", "-q"], open_stdin=True)
            assert (await sb.get_process(pid)).open_stdin
            await sb.write_stdin(pid, "x = 6 * 7\n")
            async with await sb.attach(pid) as term:
                await term.send("print(x)\n")
                await auntil(term, "42")
                with pytest.raises(DeadlineExceeded):
                    await term.wait(timeout=0.2)
                await term.close_stdin()
                res = await term.wait(timeout=15)
            assert res.exit_code == 0
            assert (await sb.wait_process(pid, timeout=10)).exit_code == 0
            with pytest.raises(Conflict):
                await sb.write_stdin(pid, "x")
            with pytest.raises(NotFound):
                await sb.attach(99999)
            with pytest.raises(InvalidArgument):
                await sb.open_terminal(rows=0)

    asyncio.run(main(berth_url))
    asyncio.run(main(daemon.socket_url))
