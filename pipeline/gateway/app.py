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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Send

from pipeline.blobs import BlobStore, blob_store
from pipeline.client.prepare import new_append_id
from pipeline.gateway import metrics
from pipeline.gateway.commands import (
    Limits,
    Problem,
    attached_to,
    attached_to_lines,
    batch_answer,
    journaled_line,
    line_error,
    parse_json,
    prepare_command,
    prepare_lines,
    prepare_submission,
)
from pipeline.gateway.console.routes import build_console
from pipeline.gateway.files import add_file_routes, blob_readers
from pipeline.gateway.guards import BodyDeadline, add_connection_handlers
from pipeline.gateway.kafka import CommandProducer, ResultsFollower
from pipeline.gateway.service import ApiError, Gateway, error_response, journaled, json_response
from pipeline.gateway.tokens import RELOAD_CHECK_S, TokenBook
from pipeline.gateway.trace_context import TraceParentMiddleware
from pipeline.gateway.webhooks import (
    WebhookError,
    github_command,
    github_signature_ok,
    slack_body,
    slack_command,
    slack_signature_ok,
)
from pipeline.settings import Settings
from processors.gate import BlobReaders, Claims
from schemas.gateway import (
    Accepted,
    BatchLine,
    BatchResults,
    Challenge,
    ErrorBody,
    EventSubmission,
    Health,
    Journaled,
)
from topics.names import topic_names

log = logging.getLogger("agentstream.gateway")

MAX_BATCH_LINES = 10_000


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
    blobs: BlobStore | None = None,
) -> FastAPI:
    topics = topic_names(settings.topic_prefix)
    blobs = blobs if blobs is not None else blob_store(settings)  # file bytes (docs/behaviour.md §3.3)
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
    app.add_middleware(TraceParentMiddleware)  # docs/behaviour.md §8: a request's traceparent is continued
    app.add_middleware(BodyDeadline, timeout_s=settings.gateway_body_timeout_s)
    _exception_handlers(app)
    add_connection_handlers(app)
    console_app, console = build_console(gateway, blobs)  # the web console (docs/operations.md, "Web console")
    app.mount("/console", console_app)
    from pipeline.gateway.mcp.http import HttpDoor  # here: the door builds on this module's Gateway

    mcp_door = HttpDoor(gateway, console.mirror)  # MCP at /mcp (docs/behaviour.md §9), the console's mirror
    app.router.routes.append(mcp_door.route)

    add_file_routes(app, gateway, blobs)

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
        readers = await blob_readers(blobs, attached_to_lines(lines))
        return Response(await _batch(gateway, claims, lines, wait, readers), media_type="application/json")

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
        readers = await blob_readers(blobs, attached_to(decoded))
        ready = prepare_submission(claims, "/" + path, decoded, new_append_id(), topics, gateway.limits, readers)
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


async def _batch(
    gateway: Gateway,
    claims: Claims,
    lines: list[tuple[int, bytes]],
    wait: bool,
    readers: BlobReaders | None = None,
) -> bytes:
    """Every line prepared, then all produced in one burst (librdkafka batches them as the raw
    producer's, instead of one small batch per few lines), with one tally of Kafka's
    acknowledgements for all of them; the answer (`BatchResults`) once each is acknowledged (or
    journaled, with `wait`). `readers`: the upload streams of the blobs the lines attach."""
    results, prepared = prepare_lines(claims, lines, gateway.topics, gateway.limits, readers)
    if len(prepared) < len(results):
        for result in results:
            if "rule" in result:
                metrics.REFUSALS.labels(result["rule"]).inc()
    readies = [ready for _, ready in prepared]
    outcomes = [gateway.results.expect(ready.append_id) for ready in readies] if wait else []
    acks = gateway.producer.acknowledgements()
    refused = gateway.submit_all(acks, readies)
    acks.seal()
    for position, problem in refused.items():
        index, ready = prepared[position]
        gateway.results.forget(ready.append_id)
        results[index] = line_error(results[index]["line"], problem)
    await acks.done
    failures = acks.failures()
    if not wait and not failures:
        return batch_answer(results)  # every line produced is acknowledged: its answer stands
    pending = [(index, ready, position) for position, (index, ready) in enumerate(prepared) if position not in refused]
    waiting = [outcomes[position] for _, ready, position in pending if wait and ready.value not in failures]
    if waiting:
        await asyncio.wait(waiting, timeout=gateway.settings.gateway_wait_timeout_s)
    for index, ready, position in pending:
        number = results[index]["line"]
        gateway.results.forget(ready.append_id)
        error = failures.get(ready.value)
        if error is not None:
            results[index] = line_error(number, Problem(503, "kafka_unavailable", str(error)))
        elif wait:
            outcome = outcomes[position]
            done = outcome.result() if outcome.done() else None
            answer = gateway.timeout_problem(ready) if done is None else journaled(done)
            if isinstance(answer, Problem):
                results[index] = line_error(number, answer)
            else:
                results[index] = journaled_line(number, answer)
    return batch_answer(results)


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
