"""Talk to an agent that lives inside a berth sandbox, one sandbox per thread.

    make run                                   # in one shell: berth on 127.0.0.1:7680
    pip install ./sdk/python                   # the SDK (with websockets)
    python3 examples/agent-inside/client.py --thread demo "make a file hello.txt"
    python3 examples/agent-inside/client.py --thread demo "what did I ask before?"

The first call for a thread makes its sandbox, copies agent.py in and starts
it; later calls find the same sandbox (started again if its idle timeout
stopped it, and the agent with it) and the agent still listening, with the
conversation so far in conversation.jsonl. With --model-url the agent calls
a real model server; --model-secret names a berth secret (berth secret add)
that the daemon adds to those calls, so the key never enters the sandbox.
See README.md beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from urllib.parse import urlsplit

from websockets.sync.client import connect

from berth import ACCESS_TOKEN_HEADER, Berth, DeadlineExceeded

HERE = os.path.dirname(os.path.abspath(__file__))
WORKDIR = "/home/user/agent"  # the agent's working directory inside, and where it keeps the conversation
PORT = 8000


def sandbox_for(client: Berth, thread: str, model_url: str | None, model_secret: str | None):
    """The thread's sandbox: made the first time, the same one after."""
    kw: dict = {"idle_timeout": 15 * 60, "delete_after": 7 * 24 * 3600}
    if model_url:
        host = urlsplit(model_url).hostname
        network: dict = {"mode": "allowlist", "allow": [host]}
        if model_secret:
            # The sandbox gets MODEL_API_KEY=berth-ph-…; berth swaps in the
            # secret on requests to host, and only there.
            network["secrets"] = [{"secret": model_secret, "host": host, "env": "MODEL_API_KEY"}]
        kw.update(env={"MODEL_URL": model_url}, network=network)
    return client.get_or_create({"thread_id": thread}, **kw)


def ensure_agent(sb) -> None:
    """agent.py copied in and listening on PORT (started if it is not)."""
    if not sb.exists(f"{WORKDIR}/agent.py"):
        with open(os.path.join(HERE, "agent.py"), "rb") as f:
            sb.upload(f"{WORKDIR}/agent.py", f.read())
    if any(p.port == PORT for p in sb.ports()):
        return
    pid = sb.start_process(["python3", "agent.py", "--port", str(PORT)], cwd=WORKDIR)
    print(f"[started the agent in {sb.id}, pid {pid}]", file=sys.stderr)
    try:
        sb.wait_for_port(PORT, timeout=30)
    except DeadlineExceeded:
        r = sb.wait_process(pid, timeout=1)
        sys.exit(f"the agent did not start listening: exit {r.exit_code}\n{r.stdout}{r.stderr}")


def chat(sb, message: str) -> None:
    """Send one message and print the events as they stream in."""
    url = "ws" + sb.url(PORT, "/chat", with_token=False)[len("http") :]
    out = _Out()
    with connect(url, additional_headers={ACCESS_TOKEN_HEADER: sb.access_token}, open_timeout=30) as ws:
        ws.send(json.dumps({"message": message}))
        for raw in ws:
            ev = json.loads(raw)
            kind = ev.get("type")
            if kind == "token":
                out.write(ev["text"])
            elif kind == "tool" and ev.get("tool") == "shell":
                out.line(f"$ {ev['command']}    [exit {ev['exit_code']}]")
                out.write(ev["output"])
            elif kind == "tool":
                out.line(f"[{ev.get('tool')} {ev.get('path')}: {ev.get('error') or str(ev.get('bytes')) + ' bytes'}]")
            elif kind == "error":
                out.line(f"[error: {ev['message']}]")
            elif kind == "done":
                out.line(f"[turn {ev.get('turn')} done]")
                return


class _Out:
    """stdout as the events come, each tool's lines starting on a line of their own."""

    def __init__(self) -> None:
        self.at_start = True

    def write(self, s: str) -> None:
        if s:
            sys.stdout.write(s)
            sys.stdout.flush()
            self.at_start = s.endswith("\n")

    def line(self, s: str) -> None:
        self.write(("" if self.at_start else "\n") + s + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description="Talk to the agent inside a thread's sandbox.")
    p.add_argument("message")
    p.add_argument("--thread", required=True, help="the conversation: one sandbox per thread id")
    p.add_argument("--url", default=None, help="the berth daemon (default $BERTH_URL or http://127.0.0.1:7680)")
    p.add_argument("--model-url", default=None, help="the agent's model server (default: the agent's built-in scripted model)")
    p.add_argument("--model-secret", default=None, help="a berth secret the daemon adds to the model calls")
    args = p.parse_args()
    with Berth(args.url) as client:
        sb = sandbox_for(client, args.thread, args.model_url, args.model_secret)
        print(f"[thread {args.thread}: sandbox {sb.id}]", file=sys.stderr)
        ensure_agent(sb)
        chat(sb, args.message)


if __name__ == "__main__":
    main()
