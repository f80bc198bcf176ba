"""What every door of the gateway shares: the `Gateway` (settings, tokens, the producer and the
outcome follower), its errors (`ApiError` carrying a `Problem`) and JSON answers. The HTTP API
(`app.py`), the console (`console/routes.py`) and the MCP door (`pipeline/gateway/mcp/`) build on it;
it imports none of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import orjson
from confluent_kafka import KafkaError
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from pipeline import tracing
from pipeline.gateway import metrics
from pipeline.gateway.commands import Limits, Problem, Ready
from pipeline.gateway.kafka import Acknowledgements, CommandProducer, KafkaUnavailable, ResultsFollower, Saturated
from pipeline.gateway.tokens import TokenBook
from pipeline.settings import Settings
from processors.gate import Claims
from schemas.gateway import Accepted, ErrorBody, Journaled
from schemas.outcomes import AppendOutcome
from topics.names import TopicNames

RETRY_AFTER_S = "1"


class ApiError(Exception):
    def __init__(self, problem: Problem, headers: dict[str, str] | None = None) -> None:
        super().__init__(problem.detail)
        self.problem = problem
        self.headers = headers or {}


def unauthorized(detail: str) -> ApiError:
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
            raise unauthorized("send 'Authorization: Bearer <token>'")
        claims = self.tokens.claims(token.strip())
        if claims is None:
            raise unauthorized("unknown or revoked token")
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
            future = self.producer.submit(ready.topic, ready.key, ready.value, _traceparent(ready))
        except (Saturated, KafkaUnavailable) as error:
            raise _producer_refusal(error) from None
        self.count_produced(ready.topic == self.topics.internal_appends)
        return future

    def submit_all(self, acks: Acknowledgements, readies: list[Ready]) -> dict[int, Problem]:
        """Produce many commands, each acknowledgement tallied by `acks`, and count them: the
        producer's immediate refusal of each it did not take, by its index (429 while its queue is
        full, 503 while Kafka is unreachable). Without a traceparent header to send (tracing off,
        none in the request) each topic's records go in one call."""
        refused: dict[int, Problem] = {}
        if tracing.ON or tracing.PARENT.get() is not None:
            for index, ready in enumerate(readies):
                try:
                    self.producer.submit_into(acks, ready.topic, ready.key, ready.value, _traceparent(ready))
                except (Saturated, KafkaUnavailable) as error:
                    refused[index] = _producer_refusal(error).problem
                else:
                    self.count_produced(ready.topic == self.topics.internal_appends)
            return refused
        by_topic: dict[str, list[int]] = {}
        for index, ready in enumerate(readies):
            by_topic.setdefault(ready.topic, []).append(index)
        for topic, indices in by_topic.items():
            records = [{"key": readies[index].key, "value": readies[index].value} for index in indices]
            try:
                taken = self.producer.submit_batch(acks, topic, records)
            except KafkaUnavailable as unavailable:
                refused.update((index, _producer_refusal(unavailable).problem) for index in indices)
                continue
            if taken < len(records):
                for index, record in zip(indices, records, strict=True):
                    if "_error" in record:
                        refused[index] = _producer_refusal(_not_taken(topic, record["_error"])).problem
            self.count_produced(topic == self.topics.internal_appends, taken)
        return refused

    def count_produced(self, internal: bool, commands: int = 1) -> None:
        (metrics.COMMANDS_TO_INTERNAL if internal else metrics.COMMANDS_TO_APPENDS).inc(commands)

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


def _producer_refusal(error: Saturated | KafkaUnavailable) -> ApiError:
    """The producer's immediate refusal as an answer: 429 while its queue is full, 503 while Kafka
    is unreachable."""
    if isinstance(error, Saturated):
        metrics.REFUSALS.labels("saturated").inc()
        return ApiError(Problem(429, "saturated", f"{error}; retry shortly"), {"Retry-After": RETRY_AFTER_S})
    metrics.REFUSALS.labels("unavailable").inc()
    return ApiError(Problem(503, "kafka_unavailable", str(error)), {"Retry-After": "5"})


def _not_taken(topic: str, error: KafkaError) -> Saturated | KafkaUnavailable:
    """Why librdkafka did not take a record of a batch, as `submit` would have raised it."""
    if error.code() == KafkaError._QUEUE_FULL:
        return Saturated("the gateway's producer queue is full")
    return KafkaUnavailable(f"could not produce to {topic}: {error}")


def _traceparent(ready: Ready) -> bytes | None:
    """The record's traceparent header (docs/behaviour.md §8): a child span while tracing is on,
    else the request's own parent, if any."""
    parent = tracing.append_header(ready.stream_path, _event_type(ready.value), "gateway") if tracing.ON else None
    return parent or tracing.PARENT.get()


def _event_type(value: bytes) -> str:
    """The command's type, for its `agentstream.append` span (only parsed while tracing)."""
    try:
        return str(orjson.loads(value).get("type"))
    except (orjson.JSONDecodeError, AttributeError):
        return ""
