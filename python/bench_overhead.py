"""Per-step overhead of the Python path next to the Rust path, through the same drive loop.

    python python/bench_overhead.py [--runs 15] [--calls 10] [--store DIR_OR_S3_URL]

Each run takes 2 * calls + 1 steps (a model turn with one tool call, its result, ..., the
final answer), on a fresh store prefix per path:

* rust:     the scripted model and a command tool (`true`), both in Rust (as `rekindle run`)
* py-model: a Python model callable and the command tool
* py-tool:  the Rust scripted model and a Python tool
* python:   a Python model and a Python tool

Prints, per path, the median milliseconds per step over the runs and the store requests per
step (the same for every path: the drive loop commits one fact per step), then what a Python
model turn and a Python tool call cost next to their Rust counterparts (the difference of the
medians, per model turn and per tool call).
"""

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import rekindle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--store", default=None, help="a store URL (default: a temporary directory)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rekindle-bench-"))
    (tmp / "script.json").write_text(json.dumps(
        [{"content": None, "tool_calls": [{"name": "noop", "arguments": {"i": i}}]} for i in range(args.calls)]
        + [{"content": "done"}]))
    (tmp / "rekindle.toml").write_text(
        '[model]\nkind = "scripted"\nname = "bench"\nscript = "script.json"\n\n'
        '[[tools]]\nname = "noop"\nschema = { type = "object" }\ncommand = ["true"]\n')
    config = rekindle.Config.load(str(tmp / "rekindle.toml"))

    def python_model(messages, tools):
        done = sum(1 for m in messages if m["role"] == "assistant")
        if done < args.calls:
            return {"content": None, "tool_calls": [{"name": "noop", "arguments": {"i": done}}]}
        return "done"

    noop = rekindle.Tool(lambda i=0: "", name="noop", schema={"type": "object"})
    paths = {
        "rust": dict(model=None, tools=None),
        "py-model": dict(model=python_model, tools=None),
        "py-tool": dict(model=None, tools=[noop]),
        "python": dict(model=python_model, tools=[noop]),
    }
    medians = {}
    steps = 2 * args.calls + 1
    print(f"{args.runs} runs of {steps} steps per path, store: {args.store or 'a local directory'}")
    for name, agent in paths.items():
        base = args.store or str(tmp / f"bucket-{name}")
        url = f"{base.rstrip('/')}/bench-{name}-{uuid.uuid4().hex[:8]}" if args.store else base
        store = rekindle.Store(url)
        per_step, requests = [], []
        with rekindle.Host(store, config, state_dir=str(tmp / f"state-{name}"), **agent) as host:
            for i in range(args.runs + 1):
                before = store.requests()["requests"]
                started = time.perf_counter()
                result = host.run(f"{name}-{i}", "go")
                elapsed = time.perf_counter() - started
                assert result["status"] == "finished", result
                if i == 0:
                    continue  # warm-up
                per_step.append(elapsed * 1000 / steps)
                requests.append((store.requests()["requests"] - before) / steps)
        medians[name] = statistics.median(per_step)
        print(f"{name:>8}: {medians[name]:6.2f} ms/step (median), "
              f"{statistics.median(requests):.2f} requests/step")
    model_turns, tool_calls = args.calls + 1, args.calls
    model_delta = (medians["py-model"] - medians["rust"]) * steps / model_turns
    tool_delta = (medians["py-tool"] - medians["rust"]) * steps / tool_calls
    print(f"a Python model turn costs {model_delta:+.2f} ms next to the Rust scripted model; "
          f"a Python tool call {tool_delta:+.2f} ms next to a command tool (a process per call)")


if __name__ == "__main__":
    main()
