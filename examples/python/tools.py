"""The example agent's two tools, used by both kinds of worker: the Python host and worker
call the functions; the Rust worker (`rekindle-worker --config rekindle.toml`) runs this file
as a command tool (`python3 tools.py NAME`, arguments as JSON on stdin, identity in
REKINDLE_RUN_ID / REKINDLE_CALL_ID / REKINDLE_EPOCH).

Every call appends a line to the side-effect ledger ($EXAMPLE_LEDGER, default ledger.jsonl),
keyed by the call's idempotency key, so you can see what ran where and how often.
"""

import json
import os
import sys

FORECASTS = {"oslo": "snow, -4 C", "lisbon": "sun, 19 C", "tokyo": "rain, 11 C"}


def ledger(tool: str, key: str, epoch: int, executor: str) -> None:
    path = os.environ.get("EXAMPLE_LEDGER", "ledger.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps({"tool": tool, "key": key, "epoch": epoch, "executor": executor}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def weather(city: str, key: str, epoch: int, executor: str) -> str:
    ledger("weather", key, epoch, executor)
    return FORECASTS.get(city.lower(), "unknown")


def note(text: str, key: str, epoch: int, executor: str) -> str:
    ledger("note", key, epoch, executor)
    if executor == "python-host" and os.environ.get("EXAMPLE_CRASH") == "1":
        # The host dies in the middle of this call, after its side effect: kill -9.
        os.kill(os.getpid(), 9)
    return "noted"


SCHEMAS = {
    "weather": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "note": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}

if __name__ == "__main__":
    # The command-tool form, for the Rust worker.
    name = sys.argv[1]
    args = json.load(sys.stdin)
    key = f"{os.environ['REKINDLE_RUN_ID']}:{os.environ['REKINDLE_CALL_ID']}"
    epoch = int(os.environ["REKINDLE_EPOCH"])
    print({"weather": weather, "note": note}[name](*args.values(), key, epoch, "rust-worker"))
