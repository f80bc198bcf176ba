"""The HTTP ingestion gateway (`agentstream gateway`).

- `app`: the FastAPI routes (the I/O shell: parse, gate, produce, answer);
- `commands`: turning one HTTP submission into a producible command, or the error to answer;
- `kafka`: the confluent-kafka producer, its health, and the follower of agent-append-results;
- `tokens`: the tokens file (hashes, tiers, scopes, webhook secrets) and new tokens;
- `webhooks`: GitHub and Slack signatures and the integration events they become (pure);
- `metrics`: Prometheus metrics (routes, statuses, bytes, refusals; never paths or content);
- `server`: how uvicorn serves it (deadline and size limit for request heads);
- `guards`: the request-body deadline and quiet handling of clients that go away;
- `cli`: `agentstream gateway` and `agentstream token create`.
"""
