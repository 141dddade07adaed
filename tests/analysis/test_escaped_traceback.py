"""A traceback escaped into one string of a line: torchelastic's error file as torchx prints it from a
Ray actor (the file's JSON, "py_callstack" holding the child's traceback with its newlines escaped:
torch/distributed/elastic/multiprocessing/errors/error_handler.py record_exception writes
{"message": {"message": "<type>: <msg>", "extraInfo": {"py_callstack": traceback.format_exc(), ...}}}),
or a JSON logger's exc_info. Both the offline reader (scan.py) and the collector's records
(records.py) read its lines. Paths, pids and addresses are made up."""

from __future__ import annotations

import json

from firstfault.analysis import traceback as tb
from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.records import events_from_records
from firstfault.analysis.report import Inputs, build_report
from firstfault.wire import Record
from tests.offline.scoring import first_failure_of

CALLSTACK = ('Traceback (most recent call last):\n'
             '  File "/env/lib/python3.9/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", '
             'line 113, in _call_store\n'
             '    return getattr(self._store, store_op)(*args, **kwargs)\n'
             'RuntimeError: Broken pipe\n')
# the JSON value as json.dumps writes it, behind Ray's prefix of the actor that printed it
LINE = '(CommandActor pid=552, ip=10.0.0.7)       "py_callstack": ' + json.dumps(CALLSTACK) + ','


def test_the_lines_of_an_escaped_traceback():
    lines = tb.escaped_lines(LINE)
    assert lines[0].endswith('"py_callstack": "Traceback (most recent call last):')
    assert lines[1] == CALLSTACK.split("\n")[1]  # quotes unescaped: a frame line again
    assert lines[3] == "RuntimeError: Broken pipe"
    assert tb.escaped_lines('a \\\\n b\\tc') == ['a \\n b\tc']  # an escaped backslash before n is no newline


def test_a_pasted_error_file_is_read_as_the_traceback_it_holds():
    ff = first_failure_of(LINE + "\n")
    assert (ff["signature"], ff["category"], ff["phase"]) == ("torchelastic.rendezvous_store_failed", "network", "init")
    assert ff["node"] == "10.0.0.7"  # the Ray prefix stays on every line of it


def test_the_collector_reads_it_from_the_agents_line_record():
    rec = Record(node="n1", stream="s", seq=1, source="ranklog", kind="rank.line", message=LINE,
                 observed_ns=1_700_000_000_000_000_000, fields={"path": "/logs/driver.log"})
    ff = build_report(events_from_records([rec]), load_catalog(), Inputs())["first_failure"]
    assert (ff["signature"], ff["category"]) == ("torchelastic.rendezvous_store_failed", "network")
