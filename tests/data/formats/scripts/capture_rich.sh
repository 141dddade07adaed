#!/usr/bin/env bash
# Re-captures the rich traceback samples (stderr only). Needs `pip install rich` (15.0.0 used).
cd "$(dirname "$0")"
PY=${PY:-python}
env COLUMNS=120 NO_COLOR=1 TERM=dumb $PY rich_tb.py 2> ../rich-traceback-nocolor.log >/dev/null; echo rc=$?
env COLUMNS=120 NO_COLOR=1 TERM=dumb $PY rich_tb.py --locals 2> ../rich-traceback-locals-nocolor.log >/dev/null; echo rc=$?
env COLUMNS=120 NO_COLOR=1 TERM=dumb $PY rich_tb.py --chain 2> ../rich-traceback-chained-nocolor.log >/dev/null; echo rc=$?
env -u NO_COLOR COLUMNS=120 TERM=xterm-256color FORCE_COLOR=1 $PY rich_tb.py 2> ../rich-traceback-ansi.log >/dev/null; echo rc=$?
