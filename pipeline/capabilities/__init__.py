"""The capability host (`agentstream worker capabilities`): agents run the Python they write.

- `config`: the host's own settings (`AGENTSTREAM_CAPABILITIES_*`).
- `sandbox`: runs one script in pydantic-monty (a pool of sandboxed worker subprocesses) and turns
  what happened into a settlement.
- `grants`: the functions a script may call (`read_event`, `set_context`, `send_to_agent`, `now`).
- `journal`: reads journaled events back (for `read_event` and for crash recovery).
- `host`: the consumer of `script-runs`: one script at a time per agent, many agents at once,
  `started` journaled before a run and exactly one `settled` per execution.
"""
