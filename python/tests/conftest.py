"""Fixtures: stores (a local directory, and the S3 test server `scripts/test` starts), the
fleet binaries, and processes started from `agent_proc.py`, all stopped after each test."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import rekindle

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def bin_path(name: str) -> str:
    directory = Path(os.environ.get("REKINDLE_BIN_DIR", REPO / "target" / "debug"))
    path = directory / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing: build the binaries (cargo build --bins) or set REKINDLE_BIN_DIR")
    return str(path)


@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path):
    """A fresh store: a local directory, or a new prefix on the S3 test server."""
    if request.param == "local":
        return str(tmp_path / "bucket")
    base = os.environ.get("REKINDLE_TEST_S3_URL")
    if not base:
        raise RuntimeError("REKINDLE_TEST_S3_URL is not set: run the tests through scripts/test, which starts the S3 test server")
    return f"{base.rstrip('/')}/py-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def local_url(tmp_path):
    return str(tmp_path / "bucket")


class Fleet:
    """Processes of one test: started here, killed at the end."""

    def __init__(self, url: str, tmp: Path):
        self.url = url
        self.tmp = tmp
        self.ledger = str(tmp / "ledger.jsonl")
        self.procs = []

    def spawn(self, args, **kwargs):
        log = open(self.tmp / f"proc-{len(self.procs)}.log", "w")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, **kwargs)
        proc.log_path = log.name
        self.procs.append(proc)
        return proc

    def agent(self, role, *rest, state=None):
        state = state or str(self.tmp / f"state-{role}-{len(self.procs)}")
        return self.spawn([sys.executable, str(HERE / "agent_proc.py"), role, self.url, self.ledger, state, *map(str, rest)])

    def coordinator(self):
        return self.spawn([bin_path("rekindle-coordinator"), "--store", self.url, "--lease-ttl-ms", "2000",
                           "--scan-interval-ms", "200", "--idle-scan-interval-ms", "500", "--watch-interval-ms", "200"])

    def worker(self, worker_id="py-worker-1"):
        proc = self.agent("worker", worker_id)
        assert proc.stdout.readline().strip() == "worker ready", self.log(proc)
        return proc

    def log(self, proc) -> str:
        return Path(proc.log_path).read_text()

    def ledger_lines(self):
        if not os.path.exists(self.ledger):
            return []
        return [json.loads(line) for line in Path(self.ledger).read_text().splitlines() if line]

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


@pytest.fixture
def fleet_for(tmp_path):
    fleets = []

    def make(url):
        fleet = Fleet(url, tmp_path)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop()


def wait_for(what, check, timeout=60.0, interval=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def recorded_finished(store: rekindle.Store, recovery_id: str):
    """The recovery's record once it says finished. Its worker writes it after the run's
    terminal commit (and gives the slot to the next recovery first), so a run seen ended
    may still have a record that says running for a moment."""
    record = store.recovery(recovery_id)
    return record if record and record["state"] == "finished" else None


def finished(store: rekindle.Store, run_id: str):
    """The run's terminal fact once it has one (None while it runs or does not exist yet)."""
    try:
        return store.load(run_id)["terminal"]
    except rekindle.NotFoundError:
        return None
