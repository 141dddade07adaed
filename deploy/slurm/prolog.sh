#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/opt/firstfault/slurm/prolog.sh): mark the job's start for
# this node's firstfault agent. Never fails the job; see mark.sh.
case "$0" in */*) here="${0%/*}" ;; *) here=. ;; esac
exec /bin/sh "$here/mark.sh" start
