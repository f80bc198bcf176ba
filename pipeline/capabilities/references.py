"""Which events an agent's own journal references: its default read grant (docs/behaviour.md §6.6).

An agent may read exactly the events its own items point at (`refs` of type `event`: a routed
webhook, say) without any glob granting their streams. Journaled events never change, so the set
only grows: each agent's index remembers how far it has read its stream and reads on from there.
Every ref found grants its read: the gateway admits a ref only from a writer that could read the
event itself (`processors/gate.py`, `reach_refusal`), and `agent-appends` is the trusted door.
Blocking (the journal reader is): call it from a worker thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from pipeline.kafka.journal_reader import JournalReader
from processors.grants import referenced_events

CACHED_AGENTS = 1_000


class _Index:
    __slots__ = ("lock", "read_through", "refs")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.read_through = 0  # the agent's stream offset read so far
        self.refs: set[tuple[str, int]] = set()


class ReferencedEvents:
    def __init__(self, reader: JournalReader, *, agents: int = CACHED_AGENTS) -> None:
        self.reader = reader
        self.agents = agents
        self._lock = threading.Lock()
        self._indexes: OrderedDict[str, _Index] = OrderedDict()

    def references(self, agent_path: str, target_path: str, target_offset: int) -> bool:
        """Whether an item of `agent_path`'s journal, up to its current end, references the event."""
        index = self._index(agent_path)
        with index.lock:  # one reader per agent: two runs never read its stream twice at once
            if (target_path, target_offset) in index.refs:
                return True
            for event in self.reader.events_from(agent_path, index.read_through + 1):
                index.refs.update(referenced_events(event))
                index.read_through = max(index.read_through, int(event.get("offset", 0)))
            return (target_path, target_offset) in index.refs

    def _index(self, agent_path: str) -> _Index:
        with self._lock:
            index = self._indexes.get(agent_path)
            if index is None:
                index = self._indexes[agent_path] = _Index()
                while len(self._indexes) > self.agents:
                    self._indexes.popitem(last=False)
            else:
                self._indexes.move_to_end(agent_path)
            return index
