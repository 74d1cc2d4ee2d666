"""An OpenAI Agents SDK SandboxAgent whose shell, file and patch tools run in a
berth sandbox (made for the run, deleted after it).

    berth serve &                      # or: make run
    pip install './sdk/python[openai-agents]'
    OPENAI_API_KEY=... python examples/openai_agents.py

OPENAI_DEFAULT_MODEL picks another model; BERTH_URL (and BERTH_API_KEY)
another daemon. tests/test_openai_agents.py runs main() with a scripted model.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents import Runner
from agents.models.interface import Model
from agents.run import RunConfig
from agents.sandbox import SandboxAgent, SandboxRunConfig

from berth.openai_agents import BerthSandboxClient, BerthSandboxClientOptions

TASK = "Find out which Python version the sandbox has and write it to python.txt."


async def main(model: Model | str | None = None, snapshot: Any = None) -> str:
    agent = SandboxAgent(
        name="explorer",
        model=model,  # None: the SDK's default model
        instructions="You work in a Linux sandbox; the workspace is your current directory.",
    )
    async with BerthSandboxClient() as client:
        result = await Runner.run(
            agent,
            TASK,
            run_config=RunConfig(
                sandbox=SandboxRunConfig(
                    client=client,
                    options=BerthSandboxClientOptions(memory=1 << 30, cpus=1),
                    snapshot=snapshot,  # None: the SDK's local snapshot directory
                )
            ),
        )
    print(result.final_output)
    return str(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
