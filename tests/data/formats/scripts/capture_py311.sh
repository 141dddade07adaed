#!/usr/bin/env bash
# Re-captures the Python 3.11 traceback / faulthandler samples in tests/data/formats/.
# Each sample is the program's own stderr (2>), nothing else; exit codes are noted in README.md.
cd "$(dirname "$0")"
out=..
cap() { local name=$1; shift; timeout 30 "$@" 2> "$out/$name" >/dev/null; echo "$name rc=$?"; }
cap py311-traceback-caret.log            python plain_caret.py
cap py311-chained-during-handling.log    python chained_context.py
cap py311-chained-direct-cause.log       python chained_cause.py
cap py311-exception-group-taskgroup.log  python exc_group_taskgroup.py
cap py311-exception-group-nested.log     python exc_group_nested.py
cap py311-syntaxerror.log                python syntax_error.py
cap py311-keyboardinterrupt.log          python kbint.py
cap faulthandler-dump-traceback.log      python fh_dump.py
cap faulthandler-dump-traceback-later.log python fh_later.py
cap faulthandler-register-sigusr1.log    python fh_signal.py
cap faulthandler-segfault.log            python fh_segv.py
cap faulthandler-abort.log               python fh_abort.py
