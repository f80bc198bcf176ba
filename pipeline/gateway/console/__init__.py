"""The web console (`/console` on the gateway): watch agents live and talk to them.

- `routes`: the mounted app (sign-in, pages, fragments, the live event stream, form posts);
- `views`: pure decisions: status rows, journal paging, event lines, the projection as the model
  sees it, the cached prefix of a request, turn explanations;
- `mirror`: the journal followed and folded in the gateway, pages read back from Kafka by offset;
- `sessions`: opaque server-side sessions (capped per token) and their CSRF tokens;
- `guards`: sign-in rate limits and origin check, live-stream slots (pure).

docs/operations.md, "Web console", describes it for operators.
"""
