"""A small Python agent on Rekindle: a host that runs trips, and a worker that finishes the
trips of hosts that died. The model is the OpenAI-compatible endpoint of rekindle.toml; the
tools are Python functions.

    python agent.py --store DIR_OR_S3_URL host RUN_ID "Plan a trip to Oslo"
    python agent.py --store DIR_OR_S3_URL worker [--id ID]

With EXAMPLE_CRASH=1 the host is killed (-9) in the middle of its `note` call; a
`rekindle-coordinator` on the same store hands the run to a worker (this one, or a Rust
`rekindle-worker --config rekindle.toml`), which finishes it, repeating only that call.
"""

import argparse
import json
import os
import signal
from pathlib import Path

import rekindle
import tools

HERE = Path(__file__).resolve().parent


def python_tools(executor: str):
    @rekindle.tool(description="Today's weather in a city", schema=tools.SCHEMAS["weather"])
    def weather(city, ctx):
        return tools.weather(city, ctx.idempotency_key, ctx.epoch, executor)

    @rekindle.tool(description="Write a note for the traveller", schema=tools.SCHEMAS["note"])
    def note(text, ctx):
        return tools.note(text, ctx.idempotency_key, ctx.epoch, executor)

    return [weather, note]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--config", default=str(HERE / "rekindle.toml"))
    parser.add_argument("--state-dir", default=None)
    sub = parser.add_subparsers(dest="role", required=True)
    host = sub.add_parser("host")
    host.add_argument("run_id")
    host.add_argument("prompt")
    worker = sub.add_parser("worker")
    worker.add_argument("--id", default=None)
    args = parser.parse_args()

    store = rekindle.Store(args.store)
    config = rekindle.Config.load(args.config)
    if args.role == "host":
        with rekindle.Host(store, config, tools=python_tools("python-host"), state_dir=args.state_dir,
                           lease_ttl_ms=3000) as h:
            print(json.dumps(h.run(args.run_id, args.prompt)))
    else:
        w = rekindle.Worker(store, config, tools=python_tools("python-worker"), worker_id=args.id,
                            state_dir=args.state_dir, concurrency=1, poll_interval_ms=250)
        signal.signal(signal.SIGTERM, lambda *_: w.stop())
        print(f"worker {w.worker_id} ready (fingerprint {w.fingerprint[:12]})", flush=True)
        w.run()
        print(json.dumps(w.stats()), flush=True)


if __name__ == "__main__":
    main()
