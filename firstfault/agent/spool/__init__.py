"""The agent's spool, a durable queue of records on disk (firstfault/agent/spool/format.py's
docstring is the on-disk spec; queue.py's Spool the whole). The names the rest of the agent
uses are here."""

from firstfault.agent.spool.format import COLUMNS
from firstfault.agent.spool.queue import Spool
from firstfault.agent.spool.reader import DEFAULT_READ_BYTES
from firstfault.agent.spool.state import InvalidRecordError, SpoolError, SpoolFullError, SpoolStats

__all__ = ["COLUMNS", "DEFAULT_READ_BYTES", "InvalidRecordError", "Spool", "SpoolError",
           "SpoolFullError", "SpoolStats"]
