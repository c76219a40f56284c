"""The Python package end to end: Python hosts killed -9 and finished by Python workers under
the real coordinator binary, idempotent recovery IDs, parked confirmations answered from
Python, workflows resumed after their driver dies, zombie hosts fenced, the journal API, and
the errors a user meets."""

import asyncio
import collections
import gc
import json
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest

import rekindle
from agent_proc import config, make_tools, model
from conftest import finished, recorded_finished, wait_for


def audit(lines, run_id, steps, interruptions):
    """Every call of the run ran, none more often than once plus the interruptions."""
    counts = collections.Counter(line["call"] for line in lines if line["run"] == run_id)
    expected = {f"call_{n}_1" for n in range(1, steps + 1)}
    assert set(counts) == expected, counts
    over = {call: n for call, n in counts.items() if n > 1 + interruptions}
    assert not over, f"calls ran more often than once plus {interruptions} interruption(s): {over}"
    return counts


def test_host_killed_mid_run_is_finished_by_a_python_worker(store_url, fleet_for):
    fleet = fleet_for(store_url)
    store = rekindle.Store(store_url)
    fleet.coordinator()
    worker = fleet.worker()
    host = fleet.agent("host", "run-1", 5, 3)
    assert host.wait(timeout=60) == -signal.SIGKILL, fleet.log(host)
    terminal = wait_for("the recovery to finish", lambda: finished(store, "recovery-of-run-1"))
    assert terminal["outcome"] == "completed"
    counts = audit(fleet.ledger_lines(), "run-1", steps=5, interruptions=1)
    # The call in flight when the host died ran twice (its side effect happened, its result
    # was never committed); every other call ran once.
    assert counts["call_3_1"] == 2 and sum(counts.values()) == 6, counts
    epochs = {line["epoch"] for line in fleet.ledger_lines() if line["call"] == "call_3_1"}
    assert len(epochs) == 2, "the repeat runs at a new epoch, so downstream can tell"
    record = wait_for(
        "the recovery's record", lambda: recorded_finished(store, "recovery-of-run-1")
    )
    assert record["source_run"] == "run-1", record
    # A graceful stop: SIGTERM reaches the worker's handler, which calls stop().
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, fleet.log(worker)
    stats = json.loads(worker.stdout.read().strip().splitlines()[-1])
    assert stats["finished"] == 1 and stats["failed"] == 0, stats


def test_the_same_recovery_id_admitted_twice_executes_once(local_url, fleet_for):
    fleet = fleet_for(local_url)
    store = rekindle.Store(local_url)
    host = fleet.agent("host", "run-2", 4, 2)
    assert host.wait(timeout=60) == -signal.SIGKILL, fleet.log(host)
    # Two admissions of one ID at once (a retried request): one recovery.
    records = [None, None]

    def admit(i):
        records[i] = store.spawn_recovery("run-2", "my-recovery", takeover=True)

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert records[0]["recovery_id"] == records[1]["recovery_id"] == "my-recovery"
    assert records[0]["source_generation"] == records[1]["source_generation"]
    # Another ID for the same run is refused, naming the first.
    with pytest.raises(rekindle.RefusedError) as refused:
        store.spawn_recovery("run-2", "another-recovery", takeover=True)
    assert refused.value.kind == "refused" and "my-recovery" in str(refused.value)
    fleet.coordinator()
    fleet.worker()
    assert wait_for("the recovery", lambda: finished(store, "my-recovery"))["outcome"] == "completed"
    wait_for("the recovery's record", lambda: recorded_finished(store, "my-recovery"))
    # Replayed after it finished: the same record, nothing runs again.
    again = store.spawn_recovery("run-2", "my-recovery", takeover=True)
    assert again["recovery_id"] == "my-recovery" and again["state"] == "finished", again
    counts = audit(fleet.ledger_lines(), "run-2", steps=4, interruptions=1)
    assert sum(counts.values()) == 5, counts
    with pytest.raises(rekindle.NotFoundError):
        store.load("recovery-of-run-2")


def test_a_parked_confirmation_is_answered_from_python(local_url, fleet_for, tmp_path):
    fleet = fleet_for(local_url)
    store = rekindle.Store(local_url)
    tools = make_tools(fleet.ledger, confirm=True)
    with rekindle.Host(store, config(), model=model, tools=tools, state_dir=str(tmp_path / "host")) as host:
        result = host.run("run-3", "steps=1")
    assert result["status"] == "parked", result
    parked = result["parked"]
    assert parked["waiting_for"] == "confirmation" and parked["call_id"] == "call_1_1", parked
    assert fleet.ledger_lines() == [], "a call waiting for confirmation has not run"
    with pytest.raises(rekindle.RefusedError) as wrong:
        store.answer("run-3", call_id="call_9_9", approve=True)
    assert "call_1_1" in str(wrong.value)
    with pytest.raises(rekindle.InvalidInputError):
        store.answer("run-3", call_id="call_1_1")
    store.answer("run-3", call_id="call_1_1", approve=True)
    fleet.coordinator()
    # The worker's tools need confirmation too: the same fingerprint.
    worker = rekindle.Worker(store, config(), model=model, tools=tools, worker_id="py-confirm-worker",
                             state_dir=str(tmp_path / "worker"), ttl_ms=3000, poll_interval_ms=200)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        terminal = wait_for("the answered run to finish", lambda: finished(store, "recovery-of-run-3"))
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert terminal["outcome"] == "completed"
    assert [line["call"] for line in fleet.ledger_lines()] == ["call_1_1"]


def test_a_workflow_whose_driver_dies_is_resumed(local_url, fleet_for, tmp_path):
    fleet = fleet_for(local_url)
    store = rekindle.Store(local_url)
    fleet.coordinator()
    fleet.worker()
    specs = [{"step": name, "prompt": "steps=2"} for name in ("a", "b", "c")]
    driver = fleet.agent("workflow", "wf", json.dumps(specs))
    wait_for("a step to finish", lambda: any(finished(store, f"recovery-of-wf.{s}") for s in "abc"))
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    with rekindle.Host(store, config(), model=model, tools=make_tools(fleet.ledger),
                       state_dir=str(tmp_path / "again")) as host:
        report = host.parallel_resumable(specs, "wf", poll_ms=100)
        assert sorted(report["skipped"] + report["dispatched"]) == ["a", "b", "c"], report
        # Every step this run waited for finished, and completed.
        assert sorted(c["step"] for c in report["completed"]) == sorted(report["dispatched"]), report
        assert all(c["outcome"] == "completed" for c in report["completed"]), report
        # A rerun after it finished skips everything.
        again = host.parallel_resumable(specs, "wf", poll_ms=100)
        assert sorted(again["skipped"]) == ["a", "b", "c"] and again["dispatched"] == [], again
        # A changed step is refused, not silently skipped.
        with pytest.raises(rekindle.RekindleError) as changed:
            host.parallel_resumable([{"step": "a", "prompt": "steps=3"}], "wf")
        assert "step 'a'" in str(changed.value)
    # No step ran twice: the driver died, not a step.
    for step in "abc":
        counts = audit(fleet.ledger_lines(), f"wf.{step}", steps=2, interruptions=0)
        assert sum(counts.values()) == 2


def test_a_zombie_python_host_is_fenced(local_url, tmp_path):
    store = rekindle.Store(local_url)
    entered, release = threading.Event(), threading.Event()

    def slow(n, ctx):
        entered.set()
        release.wait(30)
        return "slow done"

    tools = [rekindle.Tool(slow, name="step", schema={"type": "object", "properties": {"n": {"type": "integer"}}})]
    outcome = {}
    with rekindle.Host(store, config(), model=model, tools=tools, state_dir=str(tmp_path / "zombie")) as host:
        def drive():
            try:
                outcome["result"] = host.run("run-z", "steps=2")
            except rekindle.RekindleError as error:
                outcome["error"] = error

        thread = threading.Thread(target=drive)
        thread.start()
        assert entered.wait(30)
        # The host is alive but judged stuck: an operator takes the run over.
        record = store.spawn_recovery("run-z", "run-z-takeover", takeover=True)
        assert record["source_run"] == "run-z"
        release.set()
        thread.join(30)
    error = outcome.get("error")
    assert isinstance(error, rekindle.FencedError), outcome
    assert error.kind == "fenced" and "run-z" in str(error)
    # The journal path is fenced the same way.
    with rekindle.Host(store, config(), state_dir=str(tmp_path / "journal")) as host:
        run = host.start("run-j", "steps=1")
        run.record_model_turn(None, [{"id": "x", "name": "step", "arguments": {"n": 1}}])
        store.spawn_recovery("run-j", "run-j-takeover", takeover=True)
        with pytest.raises(rekindle.FencedError):
            run.record_tool_result("x", "too late")
    assert store.load("run-j")["pending_tool_calls"][0]["call"]["id"] == "x"


def test_a_journaling_host_killed_mid_loop_is_resumed_by_another(local_url, fleet_for, tmp_path):
    fleet = fleet_for(local_url)
    store = rekindle.Store(local_url)
    proc = fleet.agent("journal", "run-k")
    assert proc.stdout.readline().strip() == "journaled"
    assert proc.wait(timeout=30) == -signal.SIGKILL
    state = store.load("run-k")
    assert [p["call"]["id"] for p in state["pending_tool_calls"]] == ["b"], state
    assert state["terminal"] is None
    with rekindle.Host(store, config(), state_dir=str(tmp_path / "second")) as host:
        run = host.resume("run-k")
        assert run.epoch == 2
        assert [p["call"]["id"] for p in run.state()["pending_tool_calls"]] == ["b"]
        run.record_tool_result("b", "step 2 done")
        after = run.record_model_turn("finished after 2 steps")
        assert after["next_step"]["step"] == "finish", after["next_step"]
        ended = run.finish("completed", "done")
        assert ended["terminal"]["outcome"] == "completed"
        with pytest.raises(rekindle.RefusedError):
            run.record_user_message("after the end")
    assert store.load("run-k")["terminal"]["outcome"] == "completed"
    assert store.runs() == [], "a finished run leaves the index"


def test_asyncio_hosts_and_async_models_and_tools(local_url, tmp_path):
    store = rekindle.Store(local_url)
    seen = []

    async def amodel(messages, tools):
        await asyncio.sleep(0)
        return model(messages, tools)

    async def step(n, ctx):
        await asyncio.sleep(0)
        seen.append((ctx.call_id, ctx.idempotency_key))
        return {"n": n}

    async def main():
        with rekindle.Host(store, config(), model=amodel, tools=[rekindle.Tool(step, schema={"type": "object"})],
                           state_dir=str(tmp_path / "async")) as host:
            return await asyncio.gather(host.arun("as-1", "steps=2"), host.arun("as-2", "steps=1"))

    results = asyncio.run(main())
    assert [r["status"] for r in results] == ["finished", "finished"], results
    assert sorted(seen) == [("call_1_1", "as-1:call_1_1"), ("call_1_1", "as-2:call_1_1"), ("call_2_1", "as-1:call_2_1")]
    tool_messages = [m for m in store.load("as-1")["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["content"] == '{"n": 1}'


def test_models_tools_and_their_failures(local_url, tmp_path):
    store = rekindle.Store(local_url)

    class Completions:
        def create(self, model, messages, tools=None):
            # An OpenAI-style response object: model_dump() gives the wire form.
            class Response:
                def model_dump(self_inner):
                    if tools and not any(m["role"] == "tool" for m in messages):
                        return {"choices": [{"message": {"content": None, "tool_calls": [
                            {"id": "c-1", "type": "function", "function": {"name": "boom", "arguments": "{}"}}]}}],
                            "usage": {"prompt_tokens": 7, "completion_tokens": 2}}
                    return {"choices": [{"message": {"content": "saw: " + messages[-1]["content"]}}]}
            return Response()

    class Client:
        chat = type("Chat", (), {"completions": Completions()})()

    def boom():
        raise ValueError("the disk is full")

    with rekindle.Host(store, config(), model=Client(), tools=[boom], state_dir=str(tmp_path / "m")) as host:
        result = host.run("tools-1", "go")
        assert result["status"] == "finished"
        state = store.load("tools-1")
        tool = [m for m in state["messages"] if m["role"] == "tool"][0]
        assert tool["content"] == "ValueError: the disk is full" and state["counters"]["tool_errors"] == 1
        assert state["counters"]["input_tokens"] == 7
        # A model that raises fails the run's step with an error naming the model.
        def broken(messages, tools):
            raise RuntimeError("endpoint down")
    with rekindle.Host(store, config(), model=broken, state_dir=str(tmp_path / "b")) as host:
        with pytest.raises(rekindle.UnavailableError) as down:
            host.run("broken-1", "go")
        assert "py-test-model" in str(down.value) and "endpoint down" in str(down.value)
    # Opening and configuration mistakes name the problem.
    with pytest.raises(rekindle.InvalidInputError):
        rekindle.Store("s3://")
    with pytest.raises(rekindle.RekindleError) as missing:
        rekindle.Store(str(tmp_path / "nowhere"), create=False)
    assert "nowhere" in str(missing.value)
    with pytest.raises(rekindle.InvalidInputError):
        rekindle.Worker(store, config(), tools=[boom])
    with pytest.raises(rekindle.InvalidInputError):
        rekindle.Host(store, config(), tools=[boom, boom])
    with pytest.raises(rekindle.NotFoundError):
        store.load("no-such-run")


def test_sessions_save_and_load_with_compare_and_swap(local_url):
    store = rekindle.Store(local_url)
    assert store.load_session("s-1") is None
    first = store.save_session("s-1", {"notes": ["a"]})
    loaded = store.load_session("s-1")
    assert loaded["data"] == {"notes": ["a"]} and loaded["digest"] == first["digest"]
    second = store.save_session("s-1", {"notes": ["a", "b"]}, expected=first["digest"])
    assert second["generation"] == first["generation"] + 1
    with pytest.raises(rekindle.ConflictError) as stale:
        store.save_session("s-1", {"notes": ["lost"]}, expected=first["digest"])
    assert stale.value.kind == "conflict" and "s-1" in str(stale.value)
    assert store.load_session("s-1")["data"] == {"notes": ["a", "b"]}


def test_resume_run_continues_a_stopped_run_under_its_own_id(local_url, fleet_for, tmp_path):
    fleet = fleet_for(local_url)
    store = rekindle.Store(local_url)
    holder = {}
    ran = []

    def step(n, ctx):
        ran.append((ctx.call_id, ctx.epoch))
        # A tool may use the store (the package's calls nest).
        assert store.load(ctx.run_id)["pending_tool_calls"][0]["call"]["id"] == ctx.call_id
        if n == 2:
            holder["host"].stop()
        return f"step {n} done"

    tools = [rekindle.Tool(step, schema={"type": "object", "properties": {"n": {"type": "integer"}}})]
    with rekindle.Host(store, config(), model=model, tools=tools, state_dir=str(tmp_path / "one")) as host:
        holder["host"] = host
        stopped = host.run("run-r", "steps=3")
        assert stopped["status"] == "stopped", stopped
    # Another host process continues it under the same ID, fencing the first.
    with rekindle.Host(store, config(), model=model, tools=tools, state_dir=str(tmp_path / "two")) as host:
        result = host.resume_run("run-r")
    assert result["status"] == "finished", result
    assert ran == [("call_1_1", 1), ("call_2_1", 1), ("call_3_1", 2)], ran
    # A run a recovery has claimed is that recovery's to continue.
    proc = fleet.agent("host", "run-s", 3, 2)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    store.spawn_recovery("run-s", "run-s-recovery", takeover=True)
    with rekindle.Host(store, config(), model=model, tools=tools, state_dir=str(tmp_path / "three")) as host:
        with pytest.raises(rekindle.RefusedError) as claimed:
            host.resume_run("run-s")
    assert "run-s-recovery" in str(claimed.value)
    # A different configuration is refused before anything runs.
    other = rekindle.Config("another-model")
    proc = fleet.agent("host", "run-t", 3, 2)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    with rekindle.Host(store, other, model=model, tools=tools, state_dir=str(tmp_path / "four"),
                       lease_ttl_ms=2000) as host:
        with pytest.raises(rekindle.RefusedError) as changed:
            host.resume_run("run-t")
    assert "model" in str(changed.value)


def next_slot(bucket, run_id):
    """The path of a run's next generation object in a local-directory store."""
    gens = sorted(Path(bucket).glob(f"runs/*/{run_id}/gen/*"))
    last = gens[-1]
    return last.parent / str(int(last.name) + 1).zfill(len(last.name))


def test_ctrl_c_during_a_journal_commit_waits_for_the_commit(local_url, tmp_path):
    store = rekindle.Store(local_url)
    with rekindle.Host(store, config(), state_dir=str(tmp_path / "s")) as host:
        run = host.start("ctl-c", "steps=1")
        blocker = next_slot(local_url, "ctl-c") / "blocker"
        blocker.mkdir(parents=True)  # the next write fails (and is retried) for a while
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        threading.Timer(0.8, lambda: shutil.rmtree(blocker.parent)).start()
        with pytest.raises(KeyboardInterrupt):
            run.record_model_turn(None, [{"id": "a", "name": "step", "arguments": {"n": 1}}])
        # The interrupt came after the commit landed: nothing is half-written.
        assert store.load("ctl-c")["last_seq"] == 3
        run.record_tool_result("a", "done")
        run.record_model_turn("finished")
        assert run.finish()["terminal"]["outcome"] == "completed"
    assert store.load("ctl-c")["terminal"]["outcome"] == "completed"


def test_a_failed_journal_commit_is_retried_with_the_same_fact(local_url, tmp_path):
    store = rekindle.Store(local_url)
    with rekindle.Host(store, config(), state_dir=str(tmp_path / "s")) as host:
        run = host.start("retry", "steps=1")
        run.record_model_turn(None, [{"id": "a", "name": "step", "arguments": {"n": 1}}])
        slot = next_slot(local_url, "retry")
        (slot / "blocker").mkdir(parents=True)
        with pytest.raises(rekindle.UnavailableError) as down:
            run.record_tool_result("a", "done")
        assert down.value.kind == "unavailable"
        # Another fact first is refused: the failed one may have landed.
        with pytest.raises(rekindle.RefusedError) as doubt:
            run.record_model_turn("skipping ahead")
        assert "tool.result" in str(doubt.value) and "retry" in str(doubt.value)
        shutil.rmtree(slot)
        assert run.record_tool_result("a", "done")["last_seq"] == 4
        run.record_model_turn("finished")
        run.finish()
    state = store.load("retry")
    assert state["terminal"]["outcome"] == "completed" and state["last_seq"] == 6


def test_a_host_object_dropped_keeps_beating_for_its_open_journal(local_url, tmp_path):
    store = rekindle.Store(local_url)
    run = rekindle.Host(store, config(), state_dir=str(tmp_path / "s"), lease_ttl_ms=1000).start("kept", "steps=1")
    gc.collect()
    # Its holder is alive: an admission that waits for silence is refused.
    with pytest.raises(rekindle.RefusedError) as alive:
        store.spawn_recovery("kept", "kept-recovery")
    assert "kept" in str(alive.value)
    run.record_model_turn("still mine")
    assert run.finish()["terminal"]["outcome"] == "completed"


def test_stop_ends_the_runs_in_flight_only_and_close_refuses_more(local_url, tmp_path):
    store = rekindle.Store(local_url)
    holder = {}

    def step(n, ctx):
        if n == 1:
            holder["host"].stop()
        return "ok"

    tools = [rekindle.Tool(step, schema={"type": "object", "properties": {"n": {"type": "integer"}}})]
    host = rekindle.Host(store, config(), model=model, tools=tools, state_dir=str(tmp_path / "s"))
    holder["host"] = host
    assert host.run("stopped-1", "steps=2")["status"] == "stopped"
    # The next run is not stopped by the earlier stop.
    other = rekindle.Host(store, config(), model=model, tools=[rekindle.Tool(lambda n: "ok", name="step",
                          schema={"type": "object", "properties": {"n": {"type": "integer"}}})],
                          state_dir=str(tmp_path / "o"))
    assert other.holder_id != host.holder_id, "two hosts in one process never share a holder ID"
    holder["host"] = other  # step 1 of the next run stops `other`, not `host`
    assert host.run("after-stop", "steps=2")["status"] == "finished"
    host.close()
    with pytest.raises(rekindle.InvalidInputError) as closed:
        host.run("too-late", "steps=1")
    assert "closed" in str(closed.value)
    other.close()


def test_a_model_that_returns_the_wrong_shape_is_invalid_input(local_url, tmp_path):
    store = rekindle.Store(local_url)
    with rekindle.Host(store, config(), model=lambda messages, tools: 42, state_dir=str(tmp_path / "s")) as host:
        with pytest.raises(rekindle.InvalidInputError) as wrong:
            host.run("shape-1", "go")
    assert "py-test-model" in str(wrong.value) and "int" in str(wrong.value)


def test_mistakes_a_new_user_makes_name_the_problem(local_url, tmp_path):
    store = rekindle.Store(local_url)
    with pytest.raises(rekindle.NotFoundError) as ghost:
        store.answer("ghost", call_id="c1", approve=True)
    assert "ghost" in str(ghost.value) and "no such run" in str(ghost.value)
    with pytest.raises(rekindle.InvalidInputError):
        rekindle.Host(store, config(), model=42)
    with pytest.raises(rekindle.InvalidInputError) as empty:
        rekindle.Config("")
    assert "model_name" in str(empty.value)
    with pytest.raises(rekindle.InvalidInputError) as negative:
        rekindle.Config("m", max_iterations=-1)
    assert "max_iterations" in str(negative.value)
    with rekindle.Host(store, config(), model=lambda m, t: {"foo": "bar"}, state_dir=str(tmp_path / "g")) as host:
        with pytest.raises(rekindle.InvalidInputError) as garbage:
            host.run("garbage-1", "go")
        assert "content" in str(garbage.value) and "foo" in str(garbage.value)
        with pytest.raises(rekindle.InvalidInputError):
            host.run("", "go")
    with rekindle.Host(store, config(), state_dir=str(tmp_path / "j")) as host:
        with host.start("twice", "go") as run:
            run.record_model_turn("done")
            run.finish()
            with pytest.raises(rekindle.RefusedError) as twice:
                run.finish()
            assert "handed the run back (it finished)" in str(twice.value)
        # A journal left by a `with` block is handed back.
        with host.start("left", "go") as run:
            run.record_model_turn(None, [{"id": "x", "name": "step", "arguments": {}}])
        with pytest.raises(rekindle.RefusedError) as closed:
            run.record_tool_result("x", "late")
        assert "it was closed" in str(closed.value)
        with pytest.raises(rekindle.RekindleError) as no_model:
            host.run("no-model", "go")
        assert "has no model" in str(no_model.value) and "Host" in str(no_model.value)


def test_an_unreachable_store_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    with pytest.raises(rekindle.UnavailableError) as down:
        rekindle.Store("s3://nowhere/prefix", endpoint="http://127.0.0.1:1", allow_http=True,
                       region="us-east-1", timeout_ms=500, retries=1)
    assert "cannot open store 's3://nowhere/prefix'" in str(down.value)


def test_cancelling_one_async_run_stops_only_that_run(local_url, tmp_path):
    store = rekindle.Store(local_url)
    started = threading.Event()

    def step(n, ctx):
        if ctx.run_id == "victim":
            started.set()
        threading.Event().wait(0.3)
        return "ok"

    tools = [rekindle.Tool(step, schema={"type": "object", "properties": {"n": {"type": "integer"}}})]

    async def main():
        with rekindle.Host(store, config(), model=model, tools=tools, state_dir=str(tmp_path / "a")) as host:
            victim = asyncio.ensure_future(host.arun("victim", "steps=4"))
            bystander = asyncio.ensure_future(host.arun("bystander", "steps=3"))
            await asyncio.to_thread(started.wait, 30)
            victim.cancel()
            with pytest.raises(asyncio.CancelledError):
                await victim
            return await bystander

    assert asyncio.run(main())["status"] == "finished"
    victim = store.load("victim")
    assert victim["terminal"] is None and victim["counters"]["tool_results"] < 4, victim["counters"]


def test_a_worker_given_a_listen_address_serves_health_and_metrics(local_url, tmp_path):
    import socket
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = rekindle.Store(local_url)
    worker = rekindle.Worker(store, config(), model=model, tools=make_tools(str(tmp_path / "l")),
                             state_dir=str(tmp_path / "w"), listen=f"127.0.0.1:{port}")
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        def get(path):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.status, response.read().decode()

        def answers(path):
            try:
                return get(path)
            except OSError:
                return None

        assert wait_for("/healthz", lambda: answers("/healthz")) == (200, "ok\n")
        wait_for("/readyz to say ready", lambda: (answers("/readyz") or (0,))[0] == 200)
        status, text = get("/metrics")
        assert status == 200 and "rekindle_" in text
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    with pytest.raises(rekindle.InvalidInputError) as wrong:
        rekindle.Worker(store, config(), model=model, listen="not an address")
    assert "not an address" in str(wrong.value)
