"""Sandbox as a tool: a deepagents agent whose execute and file tools run in a
berth sandbox (one API call each), deleted when the agent is done.

    berth serve &                      # or: make run
    pip install './sdk/python[deepagents]' langchain-anthropic
    ANTHROPIC_API_KEY=... python examples/sandbox_as_tool.py

BERTH_MODEL picks another model (any `init_chat_model` string, e.g.
"openai:gpt-5"); BERTH_URL another daemon.
"""

from __future__ import annotations

import os

from deepagents import create_deep_agent
from langchain.chat_models import init_chat_model
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage

from berth import Berth
from berth.deepagents import BerthSandbox


def main(model: BaseChatModel | None = None) -> list[BaseMessage]:
    """Run the agent once and return its messages (the tests pass a scripted
    model)."""
    model = model or init_chat_model(os.environ.get("BERTH_MODEL", "anthropic:claude-sonnet-4-5"))
    with Berth() as client, client.create(memory=1 << 30, cpus=1) as sandbox:
        agent = create_deep_agent(
            model=model,
            backend=BerthSandbox(sandbox=sandbox),
            system_prompt="You work in a Linux sandbox. Write files under /home/user and run them with execute.",
        )
        result = agent.invoke(
            {"messages": [{"role": "user", "content": "Write and run a Python script that prints the first 20 primes."}]}
        )
        return result["messages"]


if __name__ == "__main__":
    print(main()[-1].content)
