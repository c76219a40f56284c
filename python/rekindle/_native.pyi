"""Type stubs of the native module (the classes `rekindle` re-exports or wraps)."""

from typing import Any, Dict, List, Mapping, Optional, Tuple

class RekindleError(Exception):
    """Base of every Rekindle error; ``kind`` says what to do next."""

    kind: str

class ConflictError(RekindleError):
    """``kind == "conflict"``: someone else changed the state first; reread and retry."""

class UnavailableError(RekindleError):
    """``kind == "unavailable"``: the store, the disk or the model is unavailable; back off."""

class FencedError(RekindleError):
    """``kind == "fenced"``: another writer owns the run now; stop, do not retry."""

class NotFoundError(RekindleError):
    """``kind == "not_found"``: the named run, recovery or object does not exist."""

class RefusedError(RekindleError):
    """``kind == "refused"``: the current state forbids the request."""

class InvalidInputError(RekindleError):
    """``kind == "invalid_input"``: the request or the configuration is wrong."""

class CorruptError(RekindleError):
    """``kind == "corrupt"``: stored data is damaged or from a newer build."""

class InternalError(RekindleError):
    """``kind == "internal"``: a bug in Rekindle."""

class Store:
    """A Rekindle store: a local directory (a plain path or ``file:///abs``),
    ``s3://bucket/prefix`` (credentials, region and endpoint from the AWS environment unless
    given), or ``memory://``. ``create=False`` refuses a location with no store."""

    def __init__(
        self,
        url: str,
        *,
        endpoint: Optional[str] = None,
        allow_http: Optional[bool] = None,
        region: Optional[str] = None,
        virtual_hosted_style: bool = False,
        timeout_ms: int = 30000,
        retries: int = 8,
        create: bool = True,
    ) -> None: ...
    @property
    def url(self) -> str: ...
    def requests(self) -> Dict[str, int]:
        """Requests this process sent to the store, by kind, and their total (``requests``)."""
    def spawn_recovery(
        self, source_run_id: str, recovery_id: str, *, force: bool = False, takeover: bool = False
    ) -> Dict[str, Any]:
        """Admits the recovery of ``source_run_id`` under ``recovery_id`` and returns its
        record. Idempotent: the same ID again returns the existing record; another ID for the
        same run raises ``RefusedError`` naming the first. Without ``takeover`` a holder that
        is alive is watched for its TTL first (and the admission refused if it beats);
        ``force`` resumes under a changed configuration."""
    def answer(
        self,
        run_id: str,
        *,
        call_id: Optional[str] = None,
        approve: Optional[bool] = None,
        question_id: Optional[str] = None,
        text: Optional[str] = None,
    ) -> None:
        """Answers a parked run (by its source run ID): a confirmation or a question."""
    def status(self) -> Dict[str, Any]:
        """One look at the fleet: ``leader``, ``workers``, ``runs``, ``stuck``."""
    def runs(self) -> List[Dict[str, Any]]:
        """The runs not yet done, with their state and recovery record."""
    def load(self, run_id: str) -> Dict[str, Any]:
        """A run's committed state: ``messages``, ``pending_tool_calls``, ``parked``,
        ``terminal``, ``next_step``, ``counters``."""
    def recovery(self, recovery_id: str) -> Optional[Dict[str, Any]]:
        """A recovery's record, or None."""
    def save_session(
        self, session_id: str, data: Any, *, expected: Optional[str] = None
    ) -> Dict[str, Any]:
        """Saves session data if the newest snapshot still has digest ``expected`` (None: no
        snapshot yet); raises ``ConflictError`` otherwise. Returns generation and digest."""
    def load_session(self, session_id: str) -> Optional[Dict[str, Any]]:
        """The newest session snapshot (``data``, ``generation``, ``digest``), or None."""

class StopToken:
    """Stops one ``Host.run`` / ``resume_run`` after its current step."""

    def __init__(self) -> None: ...
    def set(self) -> None: ...
    def is_set(self) -> bool: ...

class Config:
    """What a run is fingerprinted by: model name, system prompt, budgets, thinking mode (and
    the tools, given where the config is used)."""

    def __init__(
        self,
        model_name: str,
        *,
        system_prompt: str = "",
        max_iterations: Optional[int] = None,
        max_tokens: Optional[int] = None,
        max_tool_rounds: Optional[int] = None,
        steps_per_resume: Optional[int] = None,
        thinking: Optional[str] = None,
    ) -> None: ...
    @staticmethod
    def load(path: str) -> "Config":
        """Reads a rekindle.toml: its model (scripted or OpenAI-compatible) and command tools
        are used where no ``model=`` / ``tools=`` is given."""
    @property
    def model_name(self) -> str: ...
    @property
    def system_prompt(self) -> str: ...
    def fingerprint(self, tools: Optional[List[Tuple[str, str, str, bool]]] = None) -> str:
        """SHA-256 of the fingerprint (with these tool specs instead of the config's)."""

class JournalRun:
    """A run whose loop the host drives. Each ``record_*`` is durable before it returns
    (local log, then one conditional PUT) and returns the run's state after it; a fact the
    run's rules refuse raises ``InvalidInputError`` and writes nothing; a takeover since
    raises ``FencedError``. ``ask_*`` and ``finish`` hand the run back."""

    @property
    def run_id(self) -> str: ...
    @property
    def epoch(self) -> Optional[int]: ...
    def state(self) -> Optional[Dict[str, Any]]: ...
    def record_model_turn(
        self,
        content: Optional[str] = None,
        tool_calls: Optional[List[Mapping[str, Any]]] = None,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        reasoning: Optional[str] = None,
    ) -> Dict[str, Any]: ...
    def record_tool_result(
        self, call_id: str, output: str, *, is_error: bool = False, duration_ms: int = 0
    ) -> Dict[str, Any]: ...
    def record_user_message(self, text: str) -> Dict[str, Any]: ...
    def ask_confirmation(self, call_id: str, prompt: str) -> Dict[str, Any]: ...
    def ask_question(self, question_id: str, text: str) -> Dict[str, Any]: ...
    def finish(self, outcome: str = "completed", message: str = "") -> Dict[str, Any]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "JournalRun": ...
    def __exit__(self, *exc: Any) -> None: ...

class Host:
    def __init__(
        self,
        store: Store,
        config: Config,
        *,
        model: Any = None,
        tools: Any = None,
        state_dir: Optional[str] = None,
        holder_id: Optional[str] = None,
        lease_ttl_ms: int = 15000,
    ) -> None: ...
    @property
    def holder_id(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    def run(
        self, run_id: str, prompt: str, *, session_id: Optional[str] = None, stop: Optional[StopToken] = None
    ) -> Dict[str, Any]: ...
    def resume_run(self, run_id: str, *, stop: Optional[StopToken] = None) -> Dict[str, Any]: ...
    def start(self, run_id: str, prompt: str, *, session_id: Optional[str] = None) -> JournalRun: ...
    def resume(self, run_id: str) -> JournalRun: ...
    def parallel_resumable(self, specs: Any, workflow_id: str, *, poll_ms: int = 500) -> Dict[str, Any]: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...

class Worker:
    def __init__(
        self,
        store: Store,
        config: Config,
        *,
        model: Any = None,
        tools: Any = None,
        worker_id: Optional[str] = None,
        concurrency: int = 1,
        queue: Optional[int] = None,
        ttl_ms: int = 30000,
        poll_interval_ms: Optional[int] = None,
        listen: Optional[str] = None,
        advertise: Optional[str] = None,
        state_dir: Optional[str] = None,
    ) -> None: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    def run(self) -> None: ...
    def stop(self) -> None: ...
    def stats(self) -> Dict[str, int]: ...
