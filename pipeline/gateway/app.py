"""The gateway's HTTP routes (FastAPI): authenticate, read bounded bodies, prepare, produce, answer.

Decisions live in `pipeline.gateway.commands` (shape, gate, size) and `pipeline.gateway.webhooks`
(signatures); this module is the shell. Every error is JSON `{error, detail}` (403 adds the gate
`rule`): never a traceback, never a silent drop: a 202 is sent only once Kafka acknowledged the
command.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline.gateway import metrics
from pipeline.gateway.commands import (
    Limits,
    Problem,
    Ready,
    new_append_id,
    parse_json,
    prepare_command,
    prepare_line,
    prepare_submission,
)
from pipeline.gateway.console.routes import build_console
from pipeline.gateway.guards import BodyDeadline, add_connection_handlers
from pipeline.gateway.kafka import CommandProducer, KafkaUnavailable, ResultsFollower, Saturated
from pipeline.gateway.tokens import RELOAD_CHECK_S, TokenBook
from pipeline.gateway.webhooks import (
    WebhookError,
    github_command,
    github_signature_ok,
    slack_body,
    slack_command,
    slack_signature_ok,
)
from pipeline.settings import Settings
from processors.gate import Claims
from schemas.gateway import (
    Accepted,
    BatchLine,
    BatchLineAccepted,
    BatchLineError,
    BatchLineJournaled,
    BatchResults,
    Challenge,
    ErrorBody,
    EventSubmission,
    Health,
    Journaled,
)
from schemas.outcomes import AppendOutcome
from topics.names import TopicNames, topic_names

log = logging.getLogger("agentstream.gateway")

MAX_BATCH_LINES = 10_000
RETRY_AFTER_S = "1"


class ApiError(Exception):
    def __init__(self, problem: Problem, headers: dict[str, str] | None = None) -> None:
        super().__init__(problem.detail)
        self.problem = problem
        self.headers = headers or {}


def _unauthorized(detail: str) -> ApiError:
    metrics.REFUSALS.labels("auth").inc()
    return ApiError(Problem(401, "unauthorized", detail), {"WWW-Authenticate": "Bearer"})


def json_response(model: BaseModel, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        model.model_dump_json(exclude_none=True), status_code=status, media_type="application/json", headers=headers
    )


def error_response(problem: Problem, headers: dict[str, str] | None = None) -> Response:
    body = ErrorBody(error=problem.error, detail=problem.detail, rule=problem.rule)
    return json_response(body, problem.status, headers)


@dataclass
class Gateway:
    """What the routes share: settings, tokens, the producer and the outcome follower."""

    settings: Settings
    tokens: TokenBook
    topics: TopicNames
    producer: CommandProducer
    results: ResultsFollower
    limits: Limits

    def authenticate(self, request: Request) -> Claims:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("send 'Authorization: Bearer <token>'")
        claims = self.tokens.claims(token.strip())
        if claims is None:
            raise _unauthorized("unknown or revoked token")
        return claims

    async def body(self, request: Request, limit: int) -> bytes:
        """The request body, refused (413) as soon as it passes `limit` bytes."""
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise ApiError(Problem(400, "invalid_request", "Content-Length is not a number"))
            if int(declared) > limit:
                raise self._too_large(int(declared), limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise self._too_large(size, limit)
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _too_large(size: int, limit: int) -> ApiError:
        metrics.REFUSALS.labels("size").inc()
        return ApiError(Problem(413, "too_large", f"the body is {size} bytes or more, over the limit of {limit} bytes"))

    def require_kafka(self, waiting: bool) -> None:
        if not self.producer.reachable:
            metrics.REFUSALS.labels("unavailable").inc()
            raise ApiError(Problem(503, "kafka_unavailable", self.producer.problem), {"Retry-After": "5"})
        if waiting and not self.results.assigned:
            metrics.REFUSALS.labels("unavailable").inc()
            raise ApiError(
                Problem(503, "kafka_unavailable", "not yet following agent-append-results; retry shortly"),
                {"Retry-After": "1"},
            )

    def submit(self, ready: Ready) -> asyncio.Future[None]:
        """Produce; raises ApiError 429 (queue full) or 503 (unreachable) at once."""
        try:
            future = self.producer.submit(ready.topic, ready.key, ready.value)
        except Saturated as error:
            metrics.REFUSALS.labels("saturated").inc()
            raise ApiError(
                Problem(429, "saturated", f"{error}; retry shortly"), {"Retry-After": RETRY_AFTER_S}
            ) from None
        except KafkaUnavailable as error:
            metrics.REFUSALS.labels("unavailable").inc()
            raise ApiError(Problem(503, "kafka_unavailable", str(error)), {"Retry-After": "5"}) from None
        internal = ready.topic == self.topics.internal_appends
        (metrics.COMMANDS_TO_INTERNAL if internal else metrics.COMMANDS_TO_APPENDS).inc()
        return future

    async def deliver(self, ready: Ready) -> None:
        try:
            await self.submit(ready)
        except KafkaUnavailable as error:
            raise ApiError(Problem(503, "kafka_unavailable", str(error)), {"Retry-After": "5"}) from None

    async def append(self, ready: Ready, wait: bool) -> Response:
        """Produce one prepared command; answer 202, or 200 once journaled with `wait`."""
        outcome = self.results.expect(ready.append_id) if wait else None
        try:
            await self.deliver(ready)
            if outcome is None:
                return json_response(Accepted(streamPath=ready.stream_path, appendId=ready.append_id), 202)
            journaled = await self.outcome(ready, outcome)
            return json_response(journaled)
        finally:
            self.results.forget(ready.append_id)

    async def outcome(self, ready: Ready, future: asyncio.Future[AppendOutcome]) -> Journaled:
        try:
            outcome = await asyncio.wait_for(future, self.settings.gateway_wait_timeout_s)
        except TimeoutError:
            raise ApiError(self.timeout_problem(ready)) from None
        answer = journaled(outcome)
        if isinstance(answer, Problem):
            raise ApiError(answer)
        return answer

    def timeout_problem(self, ready: Ready) -> Problem:
        return Problem(
            504,
            "timeout",
            f"append {ready.append_id} is in Kafka but has no journal outcome after "
            f"{self.settings.gateway_wait_timeout_s:.0f}s: is the journal worker running?",
        )


def journaled(outcome: AppendOutcome) -> Journaled | Problem:
    """The journal's outcome as an answer: journaled or duplicate, or its rejection as a problem."""
    if outcome.status != "rejected":
        assert outcome.offset is not None
        return Journaled(streamPath=outcome.streamPath, offset=outcome.offset, duplicate=outcome.status == "duplicate")
    reason = outcome.reason or "rejected by the journal"
    if reason.startswith("idempotency key"):
        return Problem(409, "idempotency_conflict", reason)
    if reason.startswith("too_large"):
        return Problem(413, "too_large", reason)
    return Problem(400, "rejected", reason)


def _error_docs(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in statuses}


def _body_docs(model: type[BaseModel], media_type: str = "application/json") -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {media_type: {"schema": model.model_json_schema()}}}}


def build_app(
    settings: Settings,
    tokens: TokenBook,
    *,
    producer: CommandProducer | None = None,
    results: ResultsFollower | None = None,
) -> FastAPI:
    topics = topic_names(settings.topic_prefix)
    gateway = Gateway(
        settings=settings,
        tokens=tokens,
        topics=topics,
        producer=producer or CommandProducer(settings, topics),
        results=results or ResultsFollower(settings, topics.results),
        limits=Limits(settings.max_event_bytes, settings.gateway_max_user_file_bytes),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        gateway.producer.start(loop)
        gateway.results.start(loop)
        watcher = asyncio.create_task(_watch_tokens_file(tokens))
        try:
            async with mcp_door.sessions.run():
                yield
        finally:
            watcher.cancel()
            await asyncio.to_thread(console.close)
            await asyncio.to_thread(gateway.results.close)
            await asyncio.to_thread(gateway.producer.close)

    app = FastAPI(
        title="agentstream gateway",
        summary="HTTP ingestion into agent journals on Kafka, behind the append gate.",
        version="1",
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(BodyDeadline, timeout_s=settings.gateway_body_timeout_s)
    _exception_handlers(app)
    add_connection_handlers(app)
    console_app, console = build_console(gateway)  # the web console (docs/operations.md, "Web console")
    app.mount("/console", console_app)
    from pipeline.mcp_door.http import HttpDoor  # here: the door builds on this module's Gateway

    mcp_door = HttpDoor(gateway, console.mirror)  # MCP at /mcp (docs/behaviour.md §9), the console's mirror
    app.router.routes.append(mcp_door.route)

    @app.get("/healthz", response_model=Health, tags=["operations"])
    async def healthz() -> Response:
        """The process is alive (no Kafka check)."""
        return json_response(Health(status="ok"))

    @app.get("/readyz", response_model=Health, responses={503: {"model": Health}}, tags=["operations"])
    async def readyz() -> Response:
        """Kafka is reachable, the command topics exist and outcomes are followed."""
        if not gateway.producer.reachable:
            return json_response(Health(status="unavailable", detail=gateway.producer.problem), 503)
        if not gateway.results.assigned:
            return json_response(Health(status="unavailable", detail="not yet following agent-append-results"), 503)
        return json_response(Health(status="ok"))

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus metrics (text exposition format)."""
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/v1/streams/-/events:batch",
        response_model=BatchResults,
        responses=_error_docs(400, 401, 413, 503),
        openapi_extra=_body_docs(BatchLine, "application/x-ndjson"),
        tags=["streams"],
    )
    async def append_batch(request: Request, wait: bool = False) -> Response:
        """Append NDJSON commands, one per line, each naming its `streamPath` (at most 10 000 lines).

        One result per non-blank line, in order; a bad line fails alone (its `status` says how).
        With `?wait=true` each good line answers once journaled."""
        claims = gateway.authenticate(request)
        body = await gateway.body(request, settings.gateway_max_batch_bytes)
        lines = [(number, line) for number, line in enumerate(body.split(b"\n"), 1) if line.strip()]
        if len(lines) > MAX_BATCH_LINES:
            metrics.REFUSALS.labels("size").inc()
            raise ApiError(Problem(413, "too_large", f"{len(lines)} lines, over {MAX_BATCH_LINES} per batch"))
        gateway.require_kafka(wait)
        return json_response(await _batch(gateway, claims, lines, wait))

    @app.post(
        "/v1/streams/{path:path}/events",
        status_code=202,
        response_model=Accepted,
        responses={200: {"model": Journaled}, **_error_docs(400, 401, 403, 409, 413, 429, 503, 504)},
        openapi_extra=_body_docs(EventSubmission),
        tags=["streams"],
    )
    async def append_event(path: str, request: Request, wait: bool = False) -> Response:
        """Append one command `{type, payload, idempotencyKey?}` to the stream `/{path}`.

        202 `{streamPath, appendId}` once Kafka has it; with `?wait=true`, 200
        `{streamPath, offset, duplicate}` once journaled, or the journal's rejection."""
        claims = gateway.authenticate(request)
        body = await gateway.body(request, settings.gateway_max_body_bytes)
        decoded = parse_json(body)
        if isinstance(decoded, Problem):
            raise ApiError(decoded)
        ready = prepare_submission(claims, "/" + path, decoded, new_append_id(), topics, gateway.limits)
        if isinstance(ready, Problem):
            raise _refusal(ready)
        gateway.require_kafka(wait)
        return await gateway.append(ready, wait)

    @app.post(
        "/v1/webhooks/github/{install}",
        status_code=202,
        response_model=Accepted,
        responses=_error_docs(400, 401, 413, 429, 503),
        tags=["webhooks"],
    )
    async def github_webhook(install: str, request: Request) -> Response:
        """A GitHub App / repository webhook delivery, signed with the installation's secret
        (`X-Hub-Signature-256`). Appended to `/integrations/github/{install}` once per delivery id."""
        body = await gateway.body(request, settings.gateway_max_body_bytes)
        secret = tokens.github_secret(install)
        if secret is None or not github_signature_ok(secret, body, request.headers.get("x-hub-signature-256")):
            raise _bad_signature("X-Hub-Signature-256 does not match the body signed with this installation's secret")
        try:
            raw = github_command(
                install,
                request.headers.get("x-github-event"),
                request.headers.get("x-github-delivery"),
                body,
                request.headers.get("content-type"),
            )
        except WebhookError as error:
            raise ApiError(Problem(400, "invalid_webhook", str(error))) from None
        return await _webhook_append(gateway, raw, 202)

    @app.post(
        "/v1/webhooks/slack/{workspace}",
        response_model=Accepted | Challenge,
        responses=_error_docs(400, 401, 413, 429, 503),
        tags=["webhooks"],
    )
    async def slack_webhook(workspace: str, request: Request) -> Response:
        """A Slack Events API request signed with the workspace's signing secret (v0 signature,
        timestamp within 5 minutes). Answers `url_verification`; appends every event callback to
        `/integrations/slack/{workspace}` once per `event_id`."""
        body = await gateway.body(request, settings.gateway_max_body_bytes)
        secret = tokens.slack_secret(workspace)
        signed = secret is not None and slack_signature_ok(
            secret,
            body,
            request.headers.get("x-slack-request-timestamp"),
            request.headers.get("x-slack-signature"),
            time.time(),
        )
        if not signed:
            raise _bad_signature(
                "X-Slack-Signature does not match (or X-Slack-Request-Timestamp is over 5 minutes off)"
            )
        try:
            payload = slack_body(body)
            if payload.get("type") == "url_verification":
                return json_response(Challenge(challenge=str(payload.get("challenge", ""))))
            raw = slack_command(workspace, payload)
        except WebhookError as error:
            raise ApiError(Problem(400, "invalid_webhook", str(error))) from None
        return await _webhook_append(gateway, raw, 200)  # Slack wants a 200

    return app


async def _watch_tokens_file(tokens: TokenBook) -> None:
    """Check the tokens file every second even when no request comes, so that a deleted file
    revokes its tokens on time rather than at the next request."""
    while True:
        await asyncio.sleep(RELOAD_CHECK_S)
        try:
            await asyncio.to_thread(tokens.refresh)
        except Exception:  # keep watching: the next check may succeed
            log.exception("checking the gateway tokens file failed")


def _refusal(problem: Problem) -> ApiError:
    if problem.rule is not None:
        metrics.REFUSALS.labels(problem.rule).inc()
    elif problem.status == 413:
        metrics.REFUSALS.labels("size").inc()
    return ApiError(problem)


def _bad_signature(detail: str) -> ApiError:
    metrics.REFUSALS.labels("signature").inc()
    return ApiError(Problem(401, "bad_signature", detail))


async def _webhook_append(gateway: Gateway, raw: dict[str, Any], status: int) -> Response:
    # The gateway itself built this command after checking the signature, and its idempotency key
    # (`github/delivery/…`, `slack/event/…`) is one the system mints: it speaks as the platform,
    # confined to the one integration stream.
    claims = Claims(tier="platform", scope=(raw["streamPath"],), name="webhook")
    ready = prepare_command(claims, raw, new_append_id(), gateway.topics, gateway.limits)
    if isinstance(ready, Problem):
        raise _refusal(ready)
    gateway.require_kafka(waiting=False)
    await gateway.deliver(ready)
    return json_response(Accepted(streamPath=ready.stream_path, appendId=ready.append_id), status)


async def _batch(gateway: Gateway, claims: Claims, lines: list[tuple[int, bytes]], wait: bool) -> BatchResults:
    results: list[BatchLineJournaled | BatchLineAccepted | BatchLineError] = []
    pending: list[tuple[int, Ready, asyncio.Future[None], asyncio.Future[AppendOutcome] | None]] = []
    for number, line in lines:
        decoded = parse_json(line)
        ready = (
            decoded
            if isinstance(decoded, Problem)
            else prepare_line(claims, decoded, new_append_id(), gateway.topics, gateway.limits)
        )
        if isinstance(ready, Problem):
            if ready.rule is not None:
                metrics.REFUSALS.labels(ready.rule).inc()
            results.append(_line_error(number, ready))
            continue
        outcome = gateway.results.expect(ready.append_id) if wait else None
        try:
            delivery = gateway.submit(ready)
        except ApiError as error:
            gateway.results.forget(ready.append_id)
            results.append(_line_error(number, error.problem))
            continue
        results.append(BatchLineAccepted(line=number, streamPath=ready.stream_path, appendId=ready.append_id))
        pending.append((len(results) - 1, ready, delivery, outcome))
    await asyncio.gather(*(delivery for _, _, delivery, _ in pending), return_exceptions=True)
    waiting = [outcome for _, _, delivery, outcome in pending if outcome is not None and delivery.exception() is None]
    if waiting:
        await asyncio.wait(waiting, timeout=gateway.settings.gateway_wait_timeout_s)
    for index, ready, delivery, outcome in pending:
        number = results[index].line
        gateway.results.forget(ready.append_id)
        error = delivery.exception()
        if error is not None:
            results[index] = _line_error(number, Problem(503, "kafka_unavailable", str(error)))
        elif outcome is not None:
            done = outcome.result() if outcome.done() else None
            answer = gateway.timeout_problem(ready) if done is None else journaled(done)
            if isinstance(answer, Problem):
                results[index] = _line_error(number, answer)
            else:
                results[index] = BatchLineJournaled(line=number, **answer.model_dump())
    failed = sum(isinstance(result, BatchLineError) for result in results)
    return BatchResults(accepted=len(results) - failed, failed=failed, results=results)


def _line_error(number: int, problem: Problem) -> BatchLineError:
    return BatchLineError(
        line=number, status=problem.status, error=problem.error, detail=problem.detail, rule=problem.rule
    )


def _exception_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> Response:
        return error_response(error.problem, error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError) -> Response:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors())
        return error_response(Problem(400, "invalid_request", detail))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        return error_response(Problem(error.status_code, code, str(error.detail)), dict(error.headers or {}))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> Response:
        log.exception("unexpected error in the gateway")
        return error_response(Problem(500, "internal", f"unexpected {type(error).__name__}; see the gateway log"))


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class MetricsMiddleware:
    """Requests by route template and status, latency and body bytes (plain ASGI: no per-request task)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        received = 0

        async def counting_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def status_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, counting_receive, status_send)
        finally:
            route = scope.get("route")
            label = getattr(route, "path_format", None) or getattr(route, "path", None) or "unmatched"
            metrics.REQUESTS.labels(label, str(status)).inc()
            metrics.LATENCY.labels(label).observe(time.perf_counter() - started)
            if received:
                metrics.BYTES.labels(label).inc(received)
