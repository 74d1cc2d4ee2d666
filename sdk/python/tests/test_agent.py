"""deepagents end to end, with no real model: a scripted chat model drives
create_deep_agent to write a primes script into a berth sandbox, run it with
execute, and read the output back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

from berth import Berth
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


def test_deep_agent_computes_primes_in_a_sandbox(client: Berth) -> None:
    script = iter(
        [
            call("write_file", {"file_path": "/home/user/primes.py", "content": PRIMES_PY}, 1),
            call("execute", {"command": "python3 /home/user/primes.py > /home/user/primes.txt && echo ran"}, 2),
            call("read_file", {"file_path": "/home/user/primes.txt"}, 3),
            AIMessage(content="The first 50 primes are in /home/user/primes.txt."),
        ]
    )
    with client.create() as sb:
        agent = create_deep_agent(model=ScriptedModel(messages=script), backend=BerthSandbox(sandbox=sb))
        state = agent.invoke({"messages": [{"role": "user", "content": "Compute the first 50 primes in the sandbox."}]})
        tools = {m.name: m for m in state["messages"] if isinstance(m, ToolMessage)}
        assert "ran" in str(tools["execute"].content)
        want = " ".join(map(str, first_primes(50)))
        assert want in str(tools["read_file"].content)
        assert sb.download("/home/user/primes.txt").decode().strip() == want
        assert state["messages"][-1].content.startswith("The first 50 primes")
