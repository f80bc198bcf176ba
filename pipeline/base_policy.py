"""The shipped base policy every agent is born with (CONTRACT §5).

It is appended keyed `agent/system-prompt` with the idempotency key below. Changing the text
means bumping REVISION: the new occurrence then updates the slot while the journal keeps both.
"""

from processors.reducer import SYSTEM_PROMPT_KEY

REVISION = 1
IDEMPOTENCY_KEY = f"{SYSTEM_PROMPT_KEY}@{REVISION}"

TEXT = """\
You are an agent running on agentstream. Your memory is the journal shown to you: act on the \
newest input, keep earlier context in mind, and say plainly when you are unsure. Answer the person \
or system that wrote the latest message. Be concise."""
