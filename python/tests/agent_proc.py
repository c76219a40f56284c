"""The processes the tests start and kill: a host, a worker, a workflow driver, a journaling
host. They share one configuration, one scripted Python model and one tool that appends
every call to a side-effect ledger (fsynced), so a test can audit what ran.

    python agent_proc.py host     STORE LEDGER STATE RUN_ID STEPS CRASH_AT
    python agent_proc.py worker   STORE LEDGER STATE WORKER_ID
    python agent_proc.py workflow STORE LEDGER STATE WORKFLOW_ID STEPS_JSON
    python agent_proc.py journal  STORE LEDGER STATE RUN_ID
"""

import json
import os
import signal
import sys

import rekindle

# How many tool calls a run makes before its final answer; a host's prompt may say another
# number ("steps=N").
DEFAULT_STEPS = 4


def config() -> rekindle.Config:
    return rekindle.Config("py-test-model", system_prompt="Call step until done.")


def steps_of(messages) -> int:
    for m in messages:
        if m["role"] == "user" and m["content"].startswith("steps="):
            return int(m["content"].split("=", 1)[1].split()[0])
    return DEFAULT_STEPS


def model(messages, tools):
    """Turn n calls `step` with n (n = 1..steps), then answers."""
    done = sum(1 for m in messages if m["role"] == "assistant")
    if done < steps_of(messages) and tools:
        return {"content": None, "tool_calls": [{"name": "step", "arguments": {"n": done + 1}}]}
    return {"content": f"finished after {done} steps", "usage": {"prompt_tokens": 5, "completion_tokens": 3}}


def make_tools(ledger: str, crash_at: int = 0, confirm: bool = False):
    def step(n, ctx):
        """Appends the call to the ledger; a host told to crash dies (kill -9) right after the
        side effect of call `crash_at`, before its result is committed."""
        line = json.dumps({"run": ctx.run_id, "call": ctx.call_id, "epoch": ctx.epoch, "pid": os.getpid()})
        with open(ledger, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        if crash_at and n == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"step {n} done"

    return [rekindle.Tool(step, schema={"type": "object", "properties": {"n": {"type": "integer"}}}, confirm=confirm)]


def main() -> None:
    role, url, ledger, state = sys.argv[1:5]
    rest = sys.argv[5:]
    store = rekindle.Store(url)
    if role == "host":
        run_id, steps, crash_at = rest[0], int(rest[1]), int(rest[2])
        with rekindle.Host(store, config(), model=model, tools=make_tools(ledger, crash_at),
                           state_dir=state, lease_ttl_ms=2000) as host:
            print(json.dumps(host.run(run_id, f"steps={steps}")), flush=True)
    elif role == "worker":
        worker = rekindle.Worker(store, config(), model=model, tools=make_tools(ledger),
                                 worker_id=rest[0], state_dir=state, ttl_ms=3000, poll_interval_ms=200)
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        print("worker ready", flush=True)
        worker.run()
        print(json.dumps(worker.stats()), flush=True)
    elif role == "workflow":
        workflow_id, specs = rest[0], json.loads(rest[1])
        with rekindle.Host(store, config(), model=model, tools=make_tools(ledger), state_dir=state) as host:
            print(json.dumps(host.parallel_resumable(specs, workflow_id, poll_ms=100)), flush=True)
    elif role == "journal":
        run_id = rest[0]
        host = rekindle.Host(store, config(), state_dir=state, lease_ttl_ms=1000)
        run = host.start(run_id, "steps=2")
        run.record_model_turn(None, [
            {"id": "a", "name": "step", "arguments": {"n": 1}},
            {"id": "b", "name": "step", "arguments": {"n": 2}},
        ])
        run.record_tool_result("a", "step 1 done")
        print("journaled", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
