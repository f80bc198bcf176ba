"""The LLM caller (`agentstream worker caller`): `llm-requests` in, append commands out
(docs/architecture.md, "LLM caller"; docs/behaviour.md §4.3, §4.4, §4.5).

One module per concern:
- `worker`: the consumer's lifecycle, dispatch of records, cancels, rebalances, shutdown;
- `queues`: per-stream job queues (one running job per stream and kind) and stale-record skipping;
- `calls`: what a job does at the provider (expiry, context-overflow summaries, compactions);
- `provider`: one chat completion in one aiohttp POST, and what its errors mean;
- `outcomes`: appending each outcome to its stream (decided by `processors/llm_outcomes.py`);
- `commits`: the flush before each at-least-once commit (`pipeline/kafka/keyed_consumer.py` commits).
"""

from pipeline.caller.commits import CallerFatal
from pipeline.caller.worker import LlmCaller, run

__all__ = ["CallerFatal", "LlmCaller", "run"]
