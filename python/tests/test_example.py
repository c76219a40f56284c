"""examples/python as its README section runs it: an OpenAI-compatible endpoint, a
coordinator, a Python worker and a Rust worker side by side, and Python hosts killed -9 in the
middle of a tool call; every trip is finished, each repeating only the call in flight."""

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import rekindle
from conftest import REPO, bin_path, finished, wait_for

EXAMPLE = REPO / "examples" / "python"


def test_python_hosts_crash_and_python_and_rust_workers_finish_them(tmp_path, fleet_for):
    work = tmp_path / "example"
    shutil.copytree(EXAMPLE, work)
    store_url = str(tmp_path / "bucket")
    fleet = fleet_for(store_url)
    endpoint = fleet.spawn([sys.executable, str(work / "fake_openai.py"), "0"], cwd=work)
    port = re.fullmatch(r"listening (\d+)", endpoint.stdout.readline().strip()).group(1)
    toml = work / "rekindle.toml"
    toml.write_text(toml.read_text().replace("127.0.0.1:8765", f"127.0.0.1:{port}"))
    env = dict(os.environ, EXAMPLE_LEDGER=str(tmp_path / "ledger.jsonl"))
    agent = [sys.executable, str(work / "agent.py"), "--store", store_url]

    store = rekindle.Store(store_url)
    fleet.coordinator()
    py_worker = fleet.spawn(agent + ["--state-dir", str(tmp_path / "pw"), "worker", "--id", "python-1"], cwd=work, env=env)
    assert py_worker.stdout.readline().startswith("worker python-1 ready"), fleet.log(py_worker)
    fleet.spawn([bin_path("rekindle-worker"), "--store", store_url, "--config", str(toml), "--id", "rust-1",
                 "--concurrency", "1", "--lease-ttl-ms", "3000", "--poll-interval-ms", "250",
                 "--state-dir", str(tmp_path / "rw")], cwd=work, env=env)
    wait_for("both workers to register", lambda: len(store.status()["workers"]) == 2)
    # One fingerprint: the Python tools have the names and schemas of the command tools.
    config = rekindle.Config.load(str(toml))
    assert {w["fingerprint_sha256"] for w in store.status()["workers"]} == {config.fingerprint()}

    trips = {f"trip-{i}": city for i, city in enumerate(["Oslo", "Lisbon", "Tokyo", "Oslo"])}
    hosts = [fleet.spawn(agent + ["--state-dir", str(tmp_path / run), "host", run, f"Plan a trip to {city}"],
                         cwd=work, env=dict(env, EXAMPLE_CRASH="1")) for run, city in trips.items()]
    for host in hosts:
        assert host.wait(timeout=60) == -signal.SIGKILL, fleet.log(host)
    for run, city in trips.items():
        terminal = wait_for(f"{run} to be finished", lambda: finished(store, f"recovery-of-{run}"))
        assert terminal["outcome"] == "completed", terminal
        final = store.load(f"recovery-of-{run}")["messages"][-1]["content"]
        assert final.startswith(f"Trip to {city} planned"), final

    lines = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    by_key = collections.defaultdict(list)
    for line in lines:
        by_key[(line["tool"], line["key"])].append(line)
    for run in trips:
        weather, note = by_key[("weather", f"{run}:call_1")], by_key[("note", f"{run}:call_2")]
        assert [w["executor"] for w in weather] == ["python-host"], weather
        # The note call was in flight when the host died: it ran once more, on a worker, at
        # a higher epoch. Nothing else ran twice.
        assert [n["executor"] for n in note][0] == "python-host" and len(note) == 2, note
        assert note[1]["executor"] in ("python-worker", "rust-worker") and note[1]["epoch"] > note[0]["epoch"]
    assert len(lines) == 3 * len(trips)
    executors = {line["executor"] for line in lines if line["executor"] != "python-host"}
    assert executors == {"python-worker", "rust-worker"}, f"both kinds of worker took trips: {executors}"
