"""Rekindle for Python: journal, resume and recover interrupted AI-agent runs.

The Rust library does the durability: every fact is journaled to a local log and committed to
the store with one conditional PUT before a call returns, leases with fencing epochs decide who
may write a run, and a coordinator hands interrupted runs to workers. This package gives Python
hosts the same runs, with Python models and tools:

* ``Host(store, config, model=..., tools=...)``: Rekindle drives the loop (``run``,
  ``resume_run``, ``parallel_resumable``), or the host drives its own (``start`` / ``resume``
  return a ``JournalRun`` whose ``record_*`` calls are each durable).
* ``Worker(store, config, model=..., tools=...)``: executes the recoveries the coordinator
  (``rekindle-coordinator``) assigns, next to Rust workers with the same configuration.
* ``Store(url)``: ``spawn_recovery``, ``answer``, ``load``, ``runs``, ``status``,
  ``save_session`` / ``load_session``.

Errors are ``RekindleError`` subclasses whose ``kind`` says what to do next: ``fenced``,
``conflict``, ``unavailable``, ``not_found``, ``refused``, ``invalid_input``, ``corrupt``,
``internal``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from . import _native
from ._native import (
    Config,
    ConflictError,
    CorruptError,
    FencedError,
    InternalError,
    InvalidInputError,
    JournalRun,
    NotFoundError,
    RefusedError,
    RekindleError,
    StopToken,
    Store,
    UnavailableError,
)

__all__ = [
    "CallContext",
    "Config",
    "ConflictError",
    "CorruptError",
    "FencedError",
    "Host",
    "InternalError",
    "InvalidInputError",
    "JournalRun",
    "NotFoundError",
    "RefusedError",
    "RekindleError",
    "StopToken",
    "Store",
    "Tool",
    "UnavailableError",
    "Worker",
    "tool",
]


@dataclass(frozen=True)
class CallContext:
    """Who makes a tool call. ``idempotency_key`` is the same every time the same logical
    call runs (after a crash it may run once more, at a higher ``epoch``): use it to
    de-duplicate side effects downstream."""

    run_id: str
    call_id: str
    epoch: int

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.call_id}"


def _run_maybe_async(value: Any) -> Any:
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value


class Tool:
    """A Python callable the model may call.

    The call's arguments arrive as keyword arguments; a parameter named ``ctx`` receives the
    ``CallContext``. The return value is shown to the model (a string as is, anything else as
    JSON); an exception is a failed call (``is_error``), which the model sees too. ``async``
    functions work. ``schema`` is the JSON Schema of the arguments (by default, one property per
    parameter); it is part of the configuration fingerprint, as is ``name``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        schema: Optional[Mapping[str, Any]] = None,
        confirm: bool = False,
    ) -> None:
        if not callable(fn):
            raise InvalidInputError(f"tool {name or fn!r} is not callable")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or ""
        if not self.name:
            raise InvalidInputError("a tool needs a name")
        self.description = description if description is not None else (inspect.getdoc(fn) or "")
        self.confirm = confirm
        signature = inspect.signature(fn)
        self._takes_ctx = "ctx" in signature.parameters
        if schema is None:
            params = [
                p
                for p in signature.parameters.values()
                if p.name != "ctx" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            ]
            schema = {
                "type": "object",
                "properties": {p.name: {} for p in params},
                "required": [p.name for p in params if p.default is p.empty],
            }
        self.schema = dict(schema)

    def invoke(self, arguments: Mapping[str, Any], ctx: CallContext) -> Any:
        kwargs = dict(arguments)
        if self._takes_ctx:
            kwargs["ctx"] = ctx
        return _run_maybe_async(self.fn(**kwargs))

    def __repr__(self) -> str:
        return f"rekindle.Tool({self.name!r})"


def tool(
    fn: Optional[Callable[..., Any]] = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    schema: Optional[Mapping[str, Any]] = None,
    confirm: bool = False,
) -> Any:
    """Decorator form of ``Tool``: ``@rekindle.tool`` or ``@rekindle.tool(confirm=True)``."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, schema=schema, confirm=confirm)

    return wrap(fn) if fn is not None else wrap


ToolsLike = Union[Iterable[Union[Tool, Callable[..., Any]]], Mapping[str, Callable[..., Any]]]


class _Tools:
    """The adapter the native worker calls: specs, and one call with JSON arguments."""

    def __init__(self, tools: ToolsLike) -> None:
        if isinstance(tools, Mapping):
            items = [t if isinstance(t, Tool) else Tool(t, name=n) for n, t in tools.items()]
        else:
            items = [t if isinstance(t, Tool) else Tool(t) for t in tools]
        self.tools: Dict[str, Tool] = {}
        for t in items:
            if t.name in self.tools:
                raise InvalidInputError(f"tool '{t.name}' is given twice")
            self.tools[t.name] = t

    def _specs(self) -> List[tuple]:
        return [
            (t.name, t.description, json.dumps(t.schema, sort_keys=True), t.confirm)
            for t in self.tools.values()
        ]

    def _call(self, name: str, arguments: str, run_id: str, call_id: str, epoch: int) -> tuple:
        t = self.tools.get(name)
        if t is None:
            return (f"no tool named '{name}'", True)
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError as e:
            return (f"tool '{name}': the arguments are not JSON: {e}", True)
        if not isinstance(args, dict):
            return (f"tool '{name}': the arguments are not a JSON object", True)
        try:
            result = t.invoke(args, CallContext(run_id, call_id, epoch))
        except Exception as e:  # a failed call is a result the model sees
            return (f"{type(e).__name__}: {e}", True)
        return (result if isinstance(result, str) else json.dumps(result), False)


def _plain(value: Any) -> Any:
    """An SDK response object (pydantic, dataclass-like) as plain data."""
    for method in ("model_dump", "to_dict", "dict"):
        if hasattr(value, method) and callable(getattr(value, method)):
            return getattr(value, method)()
    return value


def _turn(result: Any, turn: int) -> Dict[str, Any]:
    """One assistant turn from what a model returned: a string, a chat-completions response,
    or a message (``content``, ``tool_calls``, ``usage``)."""
    result = _plain(result)
    if isinstance(result, str):
        return {"content": result}
    if not isinstance(result, Mapping):
        raise TypeError(f"a model returned {type(result).__name__}; expected a str or a mapping")
    usage = _plain(result.get("usage")) or {}
    if "choices" in result:
        message = _plain(result["choices"][0])
        message = _plain(message.get("message", message))
    else:
        message = result
    if not isinstance(message, Mapping) or not ({"content", "tool_calls"} & set(message)):
        raise TypeError(
            f"a model returned {dict(result)!r}; expected a message with 'content' and/or "
            "'tool_calls' (or a chat-completions response)"
        )
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        call = _plain(call)
        function = _plain(call.get("function")) or {}
        name = call.get("name") or function.get("name")
        if not isinstance(name, str) or not name:
            raise TypeError(f"tool call {i + 1} of the model's turn has no name: {call!r}")
        arguments = call.get("arguments", function.get("arguments", {}))
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(
            {"id": call.get("id") or f"call_{turn + 1}_{i + 1}", "name": name, "arguments": arguments}
        )
    out: Dict[str, Any] = {
        "content": message.get("content"),
        "tool_calls": calls,
        "usage": {
            "input_tokens": int(usage.get("input_tokens", usage.get("prompt_tokens", 0)) or 0),
            "output_tokens": int(usage.get("output_tokens", usage.get("completion_tokens", 0)) or 0),
        },
    }
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        out["reasoning"] = reasoning
    return out


class _Model:
    """The adapter the native drive loop calls for each model turn.

    A model is an OpenAI-compatible client (``client.chat.completions.create``), an object with
    ``complete(messages, tools)``, or a callable ``model(messages, tools)``; ``messages`` and
    ``tools`` are in chat-completions form, and ``async`` works for the latter two.
    """

    def __init__(self, model: Any, model_name: str) -> None:
        chat = getattr(getattr(model, "chat", None), "completions", None)
        if not (callable(model) or hasattr(model, "complete") or hasattr(chat, "create")):
            raise InvalidInputError(
                f"model {model!r} is not callable and has neither complete() nor "
                "chat.completions.create()"
            )
        self.model = model
        self.model_name = model_name

    def _complete(self, messages_json: str, tools_json: str, turn: int) -> str:
        messages = json.loads(messages_json)
        tools = json.loads(tools_json)
        chat = getattr(getattr(self.model, "chat", None), "completions", None)
        if chat is not None and hasattr(chat, "create"):
            kwargs: Dict[str, Any] = {"model": self.model_name, "messages": messages}
            if tools:
                kwargs["tools"] = tools
            result = _run_maybe_async(chat.create(**kwargs))
        elif hasattr(self.model, "complete"):
            result = _run_maybe_async(self.model.complete(messages, tools))
        else:
            result = _run_maybe_async(self.model(messages, tools))
        return json.dumps(_turn(result, turn))


def _adapters(config: Config, model: Any, tools: Optional[ToolsLike]) -> Dict[str, Any]:
    return {
        "model": None if model is None else _Model(model, config.model_name),
        "tools": None if tools is None else _Tools(tools),
    }


class Host:
    """Starts and drives runs with a model and tools (``run``), continues its own runs
    (``resume_run``), runs workflows (``parallel_resumable``), and journals runs whose loop it
    drives itself (``start``, ``resume``).

    With ``model=None`` the config's own model answers (``Config.load`` of a rekindle.toml);
    ``tools`` replaces the config's ``[[tools]]``. The host beats a heartbeat from creation
    until ``close()`` (or the end of a ``with`` block): while it beats, its runs are its own;
    once it stops (or the process dies), the fleet recovers what it left unfinished.
    """

    def __init__(
        self,
        store: Store,
        config: Config,
        *,
        model: Any = None,
        tools: Optional[ToolsLike] = None,
        state_dir: Optional[str] = None,
        holder_id: Optional[str] = None,
        lease_ttl_ms: int = 15_000,
    ) -> None:
        self.store = store
        self.config = config
        self._native = _native.Host(
            store,
            config,
            state_dir=state_dir,
            holder_id=holder_id,
            lease_ttl_ms=lease_ttl_ms,
            **_adapters(config, model, tools),
        )

    @property
    def holder_id(self) -> str:
        return self._native.holder_id

    @property
    def fingerprint(self) -> str:
        return self._native.fingerprint

    def run(
        self,
        run_id: str,
        prompt: str,
        *,
        session_id: Optional[str] = None,
        stop: Optional[StopToken] = None,
    ) -> Dict[str, Any]:
        """Starts run ``run_id`` and drives it until it ends, parks, or is stopped (``stop``'s
        ``set()``, ``Host.stop()``, Ctrl-C: after the current step). Returns ``{"run_id",
        "status": finished|parked|waiting_for_input|stopped, "terminal" | "parked"}``; the
        run's messages are in ``store.load(run_id)``.

        If the model fails (an exception from it), this raises and the run stays where it was:
        interrupted, so ``resume_run`` on a fixed host, or the fleet once this host closes,
        continues it. A tool's exception is not a failure: the model sees it as the result."""
        return self._native.run(run_id, prompt, session_id=session_id, stop=stop)

    async def arun(self, run_id: str, prompt: str, *, session_id: Optional[str] = None) -> Dict[str, Any]:
        """``run`` for asyncio: the run is driven on a worker thread; cancelling the task stops
        this run (only) after its current step."""
        token = StopToken()
        try:
            return await asyncio.to_thread(self.run, run_id, prompt, session_id=session_id, stop=token)
        except asyncio.CancelledError:
            token.set()
            raise

    def resume_run(self, run_id: str, *, stop: Optional[StopToken] = None) -> Dict[str, Any]:
        """Continues run ``run_id`` under its own ID and drives it as ``run`` does: its earlier
        holder is fenced (after its lease expires, if it is alive); a run a recovery already
        claimed is refused (``RefusedError`` naming the recovery)."""
        return self._native.resume_run(run_id, stop=stop)

    async def aresume_run(self, run_id: str) -> Dict[str, Any]:
        """``resume_run`` for asyncio; cancelling the task stops this run after its step."""
        token = StopToken()
        try:
            return await asyncio.to_thread(self.resume_run, run_id, stop=token)
        except asyncio.CancelledError:
            token.set()
            raise

    def start(self, run_id: str, prompt: str, *, session_id: Optional[str] = None) -> JournalRun:
        """Starts a run whose loop this host drives: record each step on the ``JournalRun``."""
        return self._native.start(run_id, prompt, session_id=session_id)

    def resume(self, run_id: str) -> JournalRun:
        """Takes a run over (fencing its earlier holder) to journal the rest of its loop;
        ``state()["pending_tool_calls"]`` says what was in flight."""
        return self._native.resume(run_id)

    def parallel_resumable(
        self, specs: List[Mapping[str, Any]], workflow_id: str, *, poll_ms: int = 500
    ) -> Dict[str, Any]:
        """Runs workflow ``workflow_id``: each spec (``{"step", "prompt", "session_id"?}``)
        becomes run ``<workflow_id>.<step>``, executed by the fleet's workers; the call returns
        when all have finished. Run again after a crash, it skips finished steps."""
        return self._native.parallel_resumable(list(specs), workflow_id, poll_ms=poll_ms)

    async def aparallel_resumable(
        self, specs: List[Mapping[str, Any]], workflow_id: str, *, poll_ms: int = 500
    ) -> Dict[str, Any]:
        return await asyncio.to_thread(self.parallel_resumable, specs, workflow_id, poll_ms=poll_ms)

    def stop(self) -> None:
        """Asks the runs this host drives now to stop after their current step (signal-safe);
        later runs are not affected."""
        self._native.stop()

    def close(self) -> None:
        """Stops the runs in flight after their step, then stops the heartbeat and removes it:
        what this host leaves unfinished (open ``JournalRun``s too) is the fleet's to recover
        at once. Later calls on this host raise ``InvalidInputError``."""
        self._native.close()

    def __enter__(self) -> "Host":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Worker:
    """Executes recoveries the coordinator assigns to it, with this process's model and tools.

    Its configuration fingerprint (model name, system prompt, tool names and schemas, budgets)
    decides which runs it is given, as for ``rekindle-worker``: Python and Rust workers with
    the same fingerprint serve the same runs. ``run()`` blocks until ``stop()`` (call it from a
    signal handler for a graceful SIGTERM) or Ctrl-C. It runs ``concurrency`` recoveries at
    once; ``queue`` more may wait assigned to it (default: as many as ``concurrency``, as
    ``rekindle-worker --queue``), each started as soon as a slot frees.

    Like ``rekindle-worker`` it takes wake-ups, so an assignment starts at once: given
    ``listen`` (e.g. ``"0.0.0.0:9090"``) it serves ``/healthz``, ``/readyz``, ``/metrics`` and
    ``POST /wake`` there, advertised as ``advertise`` (a URL or host, e.g. the pod IP;
    default: the listen address when it names a host); without it, wake-ups are served on an
    ephemeral loopback port that coordinators on this machine reach. ``poll_interval_ms``
    (how often it reads its inbox when nothing wakes it) defaults to 30 s with a reachable
    ``listen`` address and 2 s otherwise.
    """

    def __init__(
        self,
        store: Store,
        config: Config,
        *,
        model: Any = None,
        tools: Optional[ToolsLike] = None,
        worker_id: Optional[str] = None,
        concurrency: int = 1,
        queue: Optional[int] = None,
        ttl_ms: int = 30_000,
        poll_interval_ms: Optional[int] = None,
        listen: Optional[str] = None,
        advertise: Optional[str] = None,
        state_dir: Optional[str] = None,
    ) -> None:
        self.store = store
        self.config = config
        self._native = _native.Worker(
            store,
            config,
            worker_id=worker_id,
            concurrency=concurrency,
            queue=queue,
            ttl_ms=ttl_ms,
            poll_interval_ms=poll_interval_ms,
            listen=listen,
            advertise=advertise,
            state_dir=state_dir,
            **_adapters(config, model, tools),
        )

    @property
    def worker_id(self) -> str:
        return self._native.worker_id

    @property
    def fingerprint(self) -> str:
        return self._native.fingerprint

    def run(self) -> None:
        """Registers, heartbeats and executes assigned recoveries until ``stop()``. Ctrl-C
        stops it the same way (the running recoveries finish their step and are handed back)
        and then raises ``KeyboardInterrupt``."""
        self._native.run()

    async def arun(self) -> None:
        """``run`` on a worker thread, for asyncio; cancelling the task stops the worker."""
        try:
            await asyncio.to_thread(self.run)
        except asyncio.CancelledError:
            self.stop()
            raise

    def stop(self) -> None:
        """Asks the worker to stop gracefully (signal-safe: call it from a SIGTERM handler)."""
        self._native.stop()

    def stats(self) -> Dict[str, int]:
        """Attempts ``started``, recoveries ``finished``, attempts ``failed`` and ``fenced`` so
        far."""
        return self._native.stats()
