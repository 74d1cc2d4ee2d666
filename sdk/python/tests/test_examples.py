"""The Python examples under examples/, run against the test daemon: the
one-sandbox-per-thread script as a user runs it, and the deepagents example
with a scripted model in place of a real one."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from langchain_core.messages import AIMessage, ToolMessage
from test_agent import ScriptedModel, call

from berth import Berth

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _run(berth_url: str, *args: str) -> str:
    env = {**os.environ, "BERTH_URL": berth_url}
    out = subprocess.run([sys.executable, str(EXAMPLES / "sandbox_per_thread.py"), *args], env=env, capture_output=True, text=True, timeout=120)  # noqa: S603
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_sandbox_per_thread_example(berth_url: str, sync_client: Berth) -> None:
    thread = f"example-{os.getpid()}"
    try:
        _run(berth_url, thread, "echo hello > notes.txt")
        assert "hello" in _run(berth_url, thread, "cat notes.txt")
        assert "No such file" in _run(berth_url, thread + "-other", "cat notes.txt")
    finally:
        for t in (thread, thread + "-other"):
            for info in sync_client.list({"thread_id": t}):
                sync_client.delete(info.id)


def test_sandbox_as_tool_example(berth_url: str, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("BERTH_URL", berth_url)
    spec = importlib.util.spec_from_file_location("sandbox_as_tool", EXAMPLES / "sandbox_as_tool.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    script = iter(
        [
            call("write_file", {"file_path": "/home/user/primes.py", "content": "print(2, 3, 5, 7)\n"}, 1),
            call("execute", {"command": "python3 /home/user/primes.py"}, 2),
            AIMessage(content="The primes are 2 3 5 7."),
        ]
    )
    messages = example.main(ScriptedModel(messages=script))
    ran = next(m for m in messages if isinstance(m, ToolMessage) and m.name == "execute")
    assert "2 3 5 7" in str(ran.content)
    assert messages[-1].content == "The primes are 2 3 5 7."
