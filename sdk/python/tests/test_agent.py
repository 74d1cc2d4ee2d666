"""deepagents end to end, with no real model: a scripted chat model drives
create_deep_agent to write a primes script into a berth sandbox, run it with
execute, and read the output back."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest
from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

from berth import Berth, InvalidArgument, NotFound
from berth.deepagents import BerthSandbox

PRIMES_PY = """\
primes, n = [], 2
while len(primes) < 50:
    if all(n % p for p in primes if p * p <= n):
        primes.append(n)
    n += 1
print(" ".join(map(str, primes)))
"""


def first_primes(k: int) -> list[int]:
    out: list[int] = []
    n = 2
    while len(out) < k:
        if all(n % p for p in out):
            out.append(n)
        n += 1
    return out


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that accepts tools (and ignores them): its replies are scripted."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:  # noqa: ARG002
        return self


def call(name: str, args: dict[str, Any], i: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{i}", "type": "tool_call"}])


def test_deep_agent_computes_primes_in_a_sandbox(sync_client: Berth) -> None:
    script = iter(
        [
            call("write_file", {"file_path": "/home/user/primes.py", "content": PRIMES_PY}, 1),
            call("execute", {"command": "python3 /home/user/primes.py > /home/user/primes.txt && echo ran"}, 2),
            call("read_file", {"file_path": "/home/user/primes.txt"}, 3),
            AIMessage(content="The first 50 primes are in /home/user/primes.txt."),
        ]
    )
    with sync_client.create() as sb:
        agent = create_deep_agent(model=ScriptedModel(messages=script), backend=BerthSandbox(sandbox=sb))
        state = agent.invoke({"messages": [{"role": "user", "content": "Compute the first 50 primes in the sandbox."}]})
        tools = {m.name: m for m in state["messages"] if isinstance(m, ToolMessage)}
        assert "ran" in str(tools["execute"].content)
        want = " ".join(map(str, first_primes(50)))
        assert want in str(tools["read_file"].content)
        assert sb.download("/home/user/primes.txt").decode().strip() == want
        assert state["messages"][-1].content.startswith("The first 50 primes")


def test_large_result_is_offloaded_to_a_file_in_the_sandbox(sync_client: Berth) -> None:
    """A 300 KB execute result reaches the model as a short pointer to a file
    in /large_tool_results/, written there although the sandbox's user (uid
    1000) may not create directories at /."""
    size = 300_000
    script = iter(
        [
            call("execute", {"command": f"python3 -c \"print('q' * {size})\""}, 1),
            AIMessage(content="done"),
        ]
    )
    with sync_client.create() as sb:
        agent = create_deep_agent(model=ScriptedModel(messages=script), backend=BerthSandbox(sandbox=sb))
        state = agent.invoke({"messages": [{"role": "user", "content": "Print a lot."}]})
        seen = next(m for m in state["messages"] if isinstance(m, ToolMessage) and m.name == "execute")
        text = str(seen.content)
        assert len(text) < 10_000, f"the model saw {len(text)} characters: not offloaded"
        assert "/large_tool_results/" in text
        kept = sb.download("/large_tool_results/call_1").decode()
        assert kept.startswith("q" * size + "\n")
        owner = sb.exec("stat -c %U /large_tool_results").stdout.strip()
        assert owner == "user"


def test_idle_stopped_sandbox_is_started_by_the_next_call(sync_client: Berth) -> None:
    """The sandbox's idle timeout stops it; the agent's next tool call starts
    it again and sees its files, without the model being told anything."""
    sb = sync_client.create(ephemeral=False, idle_timeout=1)
    try:
        sb.write("/home/user/notes.txt", "kept across the stop\n")
        deadline = time.monotonic() + 60
        while sb.refresh().state != "stopped":
            assert time.monotonic() < deadline, "the idle timeout did not stop the sandbox"
            time.sleep(0.2)
        script = iter(
            [
                call("execute", {"command": "cat /home/user/notes.txt"}, 1),
                AIMessage(content="done"),
            ]
        )
        agent = create_deep_agent(model=ScriptedModel(messages=script), backend=BerthSandbox(sandbox=sb))
        state = agent.invoke({"messages": [{"role": "user", "content": "Read the notes."}]})
        seen = next(m for m in state["messages"] if isinstance(m, ToolMessage) and m.name == "execute")
        assert "kept across the stop" in str(seen.content)
        assert sb.refresh().state == "running"
    finally:
        sb.delete()


def test_errors_about_the_sandbox_are_written_for_the_model(sync_client: Berth, caplog: pytest.LogCaptureFixture) -> None:
    """A stopped sandbox without auto_start, and a deleted one: the model reads
    what happened in plain words (no routes, no file error codes); the
    daemon's message goes to the operator's log."""
    sb = sync_client.create(ephemeral=False)
    backend = BerthSandbox(sandbox=sb, auto_start=False)
    sb.stop()
    out = backend.execute("true")
    assert out.exit_code == 1 and "the sandbox is stopped" in out.output and "POST" not in out.output
    sb.delete()
    with caplog.at_level(logging.WARNING, logger="berth.deepagents"):
        read = backend.read("/home/user/notes.txt")
        ls = backend.ls("/home/user")
        out = backend.execute("true")
    for text in (read.error, ls.error, out.output):
        assert text is not None and "the sandbox was deleted" in text and "file_not_found" not in text
    assert sb.id in caplog.text, "the operator's log lacks the daemon's message"
    assert backend.write("/home/user/x", "y").error.startswith("the sandbox was deleted")
    assert backend.download_files(["/home/user/x"])[0].error.startswith("the sandbox was deleted")


def test_deepagents_code_finds_berth_as_a_sandbox_provider(sync_client: Berth) -> None:
    """The deepagents_code.sandbox_providers entry point loads BerthProvider,
    which deepagents-code calls as its registry does: entry.load()(), then
    get_or_create and delete."""
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="deepagents_code.sandbox_providers") if e.name == "berth"]
    provider = entry.load()(sync_client)
    backend = provider.get_or_create(labels={"via": "deepagents-code"})
    try:
        assert backend.execute("echo hi").output == "hi\n"
        again = provider.get_or_create(sandbox_id=backend.id)
        assert again.read("/etc/hostname").file_data is not None
        with pytest.raises(InvalidArgument, match="image"):
            provider.get_or_create(sandbox_id=backend.id, image="alpine")
    finally:
        provider.delete(sandbox_id=backend.id)
    provider.delete(sandbox_id=backend.id)  # already gone: not an error
    with pytest.raises(NotFound):
        sync_client.get(backend.id)


def test_artifact_dir_that_is_a_link_is_refused(sync_client: Berth) -> None:
    """A /large_tool_results that is a symbolic link to /etc (made by root in
    the sandbox, or shipped in an image) is not followed: the write fails and
    /etc stays root's."""
    with sync_client.create() as sb:
        assert sb.exec("ln -s /etc /large_tool_results", user="root").ok
        res = BerthSandbox(sandbox=sb).write("/large_tool_results/call_1", "x")
        assert res.error is not None
        assert sb.exec("stat -c %U /etc").stdout.strip() == "root"


def test_binary_read_is_bounded_while_it_downloads(sync_client: Berth) -> None:
    """read() of a binary file bounds the download itself, not only the stat:
    a sparse 1 GiB file is refused without bringing 1 GiB over."""
    with sync_client.create() as sb:
        sb.exec("truncate -s 1G /home/user/huge.png")
        backend = BerthSandbox(sandbox=sb)
        assert backend._download_at_most("/home/user/huge.png", 500 * 1024) is None
        res = backend.read("/home/user/huge.png")
        assert res.error is not None and "exceeds maximum preview size" in res.error
