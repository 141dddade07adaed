"""Telling people when a job dies: the first failure, within seconds, to webhooks (signed
JSON), Slack, or a local command, from a queue on disk; Prometheus counters for
Alertmanager.

    config.py    the [notify] table and [[notify.target]]s of collector.toml
    decide.py    when a job has failed and its first failure is settled (pure rules)
    notifier.py  watches the ingest, applies the rules, builds and hands over notices
    notice.py    the notice (firstfault.notice/1, docs/NOTICE.md) from a report; filters
    formats.py   the bytes each target receives: signed JSON, Slack mrkdwn (escaped)
    queue.py     pending deliveries on disk (bounded, survive restarts)
    deliver.py   deliveries: timeouts, retries with back-off, one log line each
    metrics.py   failed jobs by category and signature, the last failure's time
    attach.py    the daemon's way in: a Notifier wired to the ingest server and store
"""
