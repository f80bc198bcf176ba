"""Running one script in pydantic-monty and saying what happened as a settlement.

Monty interprets the script in a pool of worker subprocesses that have no filesystem, network,
environment or subprocesses: every such call, every import of a module Monty does not ship and
every call of a name the script did not define comes back to this host as a snapshot, and only the
granted functions answer (anything else fails inside the script). The script's last expression is
its result.

Limits: the feed's execution time and the whole run's wall time (host calls and sleeps included)
are both bounded by the run's budget; the heap by `max_memory_mb`; printed output by
`max_output_bytes`; host round trips by `max_host_calls`. A script that hits one fails with
`limit` or `timeout`; the host process is never at risk (a crashed worker is replaced by the pool).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic_monty import (
    AsyncFunctionSnapshot,
    AsyncMonty,
    AsyncNameLookupSnapshot,
    CollectString,
    MontyComplete,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySyntaxError,
)

from pipeline.capabilities.config import HostConfig
from processors import scripts

log = logging.getLogger("agentstream.capabilities")

Function = Callable[..., Awaitable[Any]]

SANDBOX_HINT = (
    "(The sandbox has no filesystem, network, environment variables, subprocesses or third-party "
    "modules; use read_event, set_context, send_to_agent and now.)"
)
_SLEEPS = frozenset({"system.sleep", "system.async_sleep"})
_LIMIT = re.compile(r"memory limit exceeded|maximum recursion depth|suspension limit|output limit")
_TIME = re.compile(r"time limit exceeded|sleep limit exceeded")
_GRANTS = re.compile(r"outside this agent's \w+ grants")  # a refusal of §6.6, not of the sandbox
_SANDBOXED = re.compile(
    r"^(ModuleNotFoundError|ImportError|PermissionError|OSError|FileNotFoundError)\b"
    r"|is not supported in this environment|module '[\w.]+' has no attribute"
)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    settlement: dict[str, Any]  # the `settlement` of script-run-settled
    duration_ms: int  # wall time of the run (checkout to result)


class Sandbox:
    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.pool = AsyncMonty(
            min_processes=min(config.warm_workers, config.concurrency),
            max_processes=config.concurrency,
            max_checkouts_per_worker=200,  # recycle workers now and then: hygiene, not correctness
        )

    async def __aenter__(self) -> Sandbox:
        await self.pool.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.__aexit__(*exc)
        # The pool's background tasks finish shortly after it closes; exiting the interpreter before
        # that can abort the process.
        await asyncio.sleep(0.2)

    async def run(self, code: str, functions: dict[str, Function], budget_s: float) -> RunOutcome:
        started = time.monotonic()
        output = CollectString(max_bytes=self.config.max_output_bytes)
        limits: dict[str, Any] = {
            "max_feed_duration_secs": budget_s,
            "max_total_sleep_secs": budget_s,
            "max_memory": self.config.max_memory_mb * 1024 * 1024,
            "max_suspensions": self.config.max_host_calls,
        }
        try:
            async with asyncio.timeout(budget_s), self.pool.checkout(limits=limits) as session:
                result = await _drive(session, code, functions, output)
            settlement = scripts.succeeded(result, output.output)
        except TimeoutError:
            settlement = scripts.failed(
                "timeout", "run", f"TimeoutError: the script ran longer than {budget_s:g}s", True, output.output
            )
        except MontySyntaxError as error:
            settlement = scripts.failed("syntax", "parse", error.display("traceback"), False, output.output)
        except MontyRuntimeError as error:
            settlement = _runtime_failure(error, output.output)
        except MontyCrashedError as error:
            kind = "timeout" if error.timed_out else "crashed"
            settlement = scripts.failed(kind, "run", f"the sandbox process died: {error}", True, output.output)
        except (MontyError, UnexpectedSnapshot) as error:  # e.g. a value that cannot cross the boundary
            settlement = scripts.failed("runtime", "run", f"{type(error).__name__}: {error}", True, output.output)
        except Exception as error:  # a host-side failure on this script: settle it, keep serving the rest
            log.exception("sandbox run failed in the host")
            settlement = scripts.failed(
                "crashed", "run", f"the capability host failed while running the script: {error}", True, output.output
            )
        return RunOutcome(settlement, int((time.monotonic() - started) * 1000))


def _runtime_failure(error: MontyRuntimeError, stdout: str) -> dict[str, Any]:
    text = error.display("traceback")
    summary = error.display("type-msg")
    if _TIME.search(summary):
        return scripts.failed("timeout", "run", text, True, stdout)
    if _LIMIT.search(summary) or isinstance(error.exception(), (MemoryError, RecursionError)):
        return scripts.failed("limit", "run", text, True, stdout)
    if _SANDBOXED.search(summary) and not _GRANTS.search(summary):
        text = f"{text}\n{SANDBOX_HINT}"
    return scripts.failed("runtime", "run", text, True, stdout)


async def _drive(session: Any, code: str, functions: dict[str, Function], output: CollectString) -> Any:
    """Run the script to completion, answering each host call: granted functions are awaited (the
    script sees them as ordinary synchronous calls), sleeps wait here, every other OS call or
    import is left to Monty's default refusal, and any other name is undefined."""
    snapshot = await session.feed_start(code, print_callback=output)
    while not isinstance(snapshot, MontyComplete):
        if isinstance(snapshot, AsyncFunctionSnapshot):
            name = snapshot.function_name
            if snapshot.is_os_function:
                if name in _SLEEPS:
                    seconds = snapshot.args[0] if snapshot.args else 0
                    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds >= 0:
                        error = {"exc_type": "ValueError", "message": "sleep length must be a non-negative number"}
                        snapshot = await snapshot.resume(error)
                        continue
                    await asyncio.sleep(seconds)  # the run's wall-time limit bounds it
                    snapshot = await snapshot.resume({"return_value": None})
                else:
                    snapshot = await snapshot.resume_auto()  # Monty's refusal (no os handler)
                continue
            function = functions.get(name) if snapshot.object_id is None else None
            if function is None:
                snapshot = await snapshot.resume({"exc_type": "NameError", "message": f"name {name!r} is not defined"})
                continue
            try:
                value = await function(*snapshot.args, **snapshot.kwargs)
            except Exception as error:  # the script sees it and may catch it
                snapshot = await snapshot.resume({"exception": error})
            else:
                snapshot = await snapshot.resume({"return_value": value})
        elif isinstance(snapshot, AsyncNameLookupSnapshot):
            function = functions.get(snapshot.variable_name)
            snapshot = await (snapshot.resume(value=function) if function is not None else snapshot.resume())
        else:  # futures: only from async host functions, which this host does not grant
            raise UnexpectedSnapshot(f"the sandbox waited on {type(snapshot).__name__}, which this host never offers")
    return snapshot.output


class UnexpectedSnapshot(RuntimeError):
    """The sandbox asked for something this host never offers."""
