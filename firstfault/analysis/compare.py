"""Did the fix work? A failed run (BEFORE) against its retry (AFTER), from their two reports. Pure.

Input: two reports as ``build_report`` makes them (REPORT.md, ``firstfault.report/1``).
Output: the compare object, ``firstfault.compare/1`` (docs/COMPARE.md). The guide's
test of a real fix: the retry changes one variable, the initiating signature is gone on
every rank, and the retry passes a complete optimizer step and checkpoint save beyond
the point where the first run died. Rules:

1. What changed, field by field (``FIELDS``): versions, launcher, launch command, world
   size, and the resolved DeepSpeed config's essentials (ZeRO stage, offload targets and
   their pin_memory, precision, micro batch, gradient accumulation), plus the checkpoint
   interval seen in the saved tags. A field is ``same``, ``changed``, ``unknown`` (neither
   run shows it) or ``one-side`` (one run shows it: whether it changed is unknown). Once a
   run printed its resolved config, an offload left out of it is a value (none), not a
   gap. The launch command is compared without its rendezvous and placement options
   (``PLACEMENT``: master port, rdzv endpoint, ...), which differ on every launch.
2. The initiating failure is BEFORE's ``first_failure``. On every rank of either run:
   does AFTER show it there, by the same fingerprint (signature + message with numbers
   blanked), or by the same signature with another message (not for the generic Python
   exception, whose signature alone says nothing)? A distinct failure tied to no rank
   counts too.
3. Boundary: BEFORE's last complete step L is the highest step any rank logged progress
   for, or the highest step of a complete checkpoint (0 when it failed at init). AFTER
   passed the failing step when its own last complete step is past L, one optimizer step
   after it when it reached L + 2, and a checkpoint save after it when a tag of step
   L + 1 or later is safe (the checkpoint verdict as ``analyze`` gives it).
4. Verdict: ``not-fixed`` when the initiating failure came back on any rank. Else
   ``inconclusive`` when BEFORE did not fail, or AFTER stopped before the failing step,
   or reached no optimizer step or no complete save after it, or more than one field
   changed. Else ``fixed``. Each verdict comes with its reasons in plain words; caveats
   (fields only one run shows, no change seen at all, another failure in AFTER) are notes.

Known limits: a report keeps each rank's first error only, so a failure that comes back
on a rank after another error there is not seen; the rank that stopped is then counted as
stopping early, which makes the verdict inconclusive, never fixed.
"""

from __future__ import annotations

import ast
import shlex
from collections.abc import Callable

from firstfault.analysis.catalog import shipped

SCHEMA = "firstfault.compare/1"
VERDICTS = ("fixed", "not-fixed", "inconclusive")
# Launcher options that say where and how ranks meet, not what they compute.
PLACEMENT = ("--master_port", "--master-port", "--master_addr", "--master-addr", "--rdzv_endpoint",
             "--rdzv-endpoint", "--rdzv_id", "--rdzv-id", "--world_info", "--local_rank", "--local-rank",
             "--node_rank", "--node-rank")


def _ctx(rep: dict) -> dict:
    return rep.get("context") or {}


def _version(name: str) -> Callable[[dict], object]:
    return lambda rep: (_ctx(rep).get("versions") or {}).get(name)


def _key(name: str) -> Callable[[dict], object]:
    return lambda rep: _ctx(rep).get(name)


def checkpoint_interval(rep: dict) -> int | None:
    """The steps between saves, when the tags' steps (any verdict) are evenly spaced; None with fewer than two."""
    steps = sorted({t["step"] for t in (rep.get("checkpoint") or {}).get("tags") or [] if t.get("step") is not None})
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    return gaps.pop() if len(gaps) == 1 else None


def launch_tokens(cmd: str | None) -> list[str] | None:
    """The launch command as arguments, without rendezvous and placement options."""
    if not cmd:
        return None
    try:
        args = ast.literal_eval(cmd) if cmd.startswith("[") else shlex.split(cmd)
    except (ValueError, SyntaxError):
        args = cmd.split()
    out, skip = [], False
    for a in map(str, args):
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in PLACEMENT:
            skip = "=" not in a
            continue
        out.append(a)
    return out


# (field, what it is, how to read it from a report, whether the resolved config must be seen for None to mean "none")
FIELDS: tuple[tuple[str, str, Callable[[dict], object], bool], ...] = (
    ("versions.deepspeed", "DeepSpeed version", _version("deepspeed"), False),
    ("versions.torch", "PyTorch version", _version("torch"), False),
    ("versions.cuda", "CUDA version", _version("cuda"), False),
    ("versions.nccl", "NCCL version", _version("nccl"), False),
    ("versions.python", "Python version", _version("python"), False),
    ("launcher", "launcher", _key("launcher"), False),
    ("launch_command", "launch command", lambda rep: launch_tokens(_ctx(rep).get("launch_command")), False),
    ("world_size", "world size", _key("world_size"), False),
    ("zero_stage", "ZeRO stage", _key("zero_stage"), False),
    ("offload_optimizer", "optimizer offload", _key("offload_optimizer"), True),
    ("offload_optimizer_pin_memory", "optimizer offload pin_memory", _key("offload_optimizer_pin_memory"), True),
    ("offload_param", "parameter offload", _key("offload_param"), True),
    ("offload_param_pin_memory", "parameter offload pin_memory", _key("offload_param_pin_memory"), True),
    ("precision", "precision", _key("precision"), False),
    ("train_micro_batch_size_per_gpu", "micro batch per GPU", _key("train_micro_batch_size_per_gpu"), False),
    ("gradient_accumulation_steps", "gradient accumulation steps", _key("gradient_accumulation_steps"), False),
    ("checkpoint_interval", "checkpoint interval", checkpoint_interval, False),
)


def _config_seen(rep: dict) -> bool:
    """Whether the run printed its resolved DeepSpeed config (it always names the ZeRO stage)."""
    return _ctx(rep).get("zero_stage") is not None


def show(v, known: bool = True) -> str:
    """A field's value in words: ``?`` when the run does not show it."""
    if not known:
        return "?"
    if v is None:
        return "none"
    if isinstance(v, list):
        return shlex.join(v)
    return str(v)


def one_side(row: dict) -> str:
    """'Python version (BEFORE: 3.11)' for a field only one run shows."""
    which, v = ("BEFORE", row["before"]) if row["before_known"] else ("AFTER", row["after"])
    return f"{row['label']} ({which}: {show(v)})"


def _command_diff(b: list[str], a: list[str]) -> dict:
    """The arguments only one launch command has (a multiset difference, in order)."""
    def minus(x: list[str], y: list[str]) -> list[str]:
        rest = list(y)
        out = []
        for t in x:
            if t in rest:
                rest.remove(t)
            else:
                out.append(t)
        return out
    return {"removed": minus(b, a), "added": minus(a, b)}


def diff_fields(before: dict, after: dict) -> dict:
    """Rule 1: every field with its status; which changed; which only one run shows."""
    seen = (_config_seen(before), _config_seen(after))
    rows = []
    for name, label, read, none_is_value in FIELDS:
        vb, va = read(before), read(after)
        known_b = vb is not None or (none_is_value and seen[0])
        known_a = va is not None or (none_is_value and seen[1])
        if known_b and known_a:
            status = "same" if vb == va else "changed"
        elif known_b or known_a:
            status = "one-side"
        else:
            status = "unknown"
        row = {"field": name, "label": label, "before": vb, "after": va, "status": status,
               "before_known": known_b, "after_known": known_a}
        if name == "launch_command" and status == "changed":
            row["diff"] = _command_diff(vb, va)
        rows.append(row)
    changed = [r["field"] for r in rows if r["status"] == "changed"]
    return {
        "fields": rows,
        "changed": changed,
        "count": len(changed),
        "exactly_one": len(changed) == 1,
        "not_comparable": [r["field"] for r in rows if r["status"] == "one-side"],
    }


def _initiating(before: dict) -> dict | None:
    ff = before.get("first_failure")
    if not ff:
        return None
    return {"signature": ff.get("signature"), "fingerprint": ff.get("fingerprint"), "rank": ff.get("rank"),
            "category": ff.get("category"), "phase": ff.get("phase"), "summary": ff.get("summary")}


def _match(init: dict, sig: str | None, fp: str | None) -> str | None:
    """same-fingerprint | same-signature | None: how an error of AFTER matches the initiating failure."""
    if sig is None or sig != init["signature"]:
        return None
    if fp is not None and init["fingerprint"] is not None:
        if fp == init["fingerprint"]:
            return "same-fingerprint"
        return None if sig in shipped().ids_with("generic") else "same-signature"
    return "same-signature"  # a report without fingerprints (older), or an inferred hang: the signature is all


def rank_matches(init: dict | None, before: dict, after: dict) -> tuple[dict, list[str]]:
    """Rule 2: per rank, BEFORE's and AFTER's first error and whether AFTER shows the initiating
    failure there; and how AFTER shows it on no rank (distinct failures tied to none)."""
    rb, ra = before.get("ranks") or {}, after.get("ranks") or {}
    seen: dict[str, str] = {}
    unranked: list[str] = []
    if init is not None:
        for r, info in ra.items():
            fe = info.get("first_error") or {}
            if m := _match(init, fe.get("signature"), fe.get("fingerprint")):
                seen[r] = m
        for d in after.get("distinct_failures") or []:
            m = _match(init, d.get("signature"), d.get("fingerprint"))
            if m and not d.get("ranks"):
                unranked.append(m)
            for r in d.get("ranks") or []:
                if m and str(r) not in seen:
                    seen[str(r)] = m
        aff = after.get("first_failure") or {}
        if aff.get("inferred") and aff.get("signature") == init["signature"]:
            r = aff.get("rank")
            if r is None:
                unranked.append("same-signature")
            else:
                seen.setdefault(str(r), "same-signature")
    out = {}
    for r in sorted(set(rb) | set(ra) | set(seen), key=int):
        fb = (rb.get(r) or {}).get("first_error") or {}
        fa = (ra.get(r) or {}).get("first_error") or {}
        out[r] = {"before": fb.get("signature"), "after": fa.get("signature"), "in_before": r in rb,
                  "in_after": r in ra, "initiating_in_after": seen.get(r)}
    return out, unranked


def last_step(rep: dict) -> int | None:
    """The highest step any rank logged progress for, or a complete checkpoint holds."""
    steps = [lp["step"] for info in (rep.get("ranks") or {}).values()
             if (lp := info.get("last_progress")) and lp.get("step") is not None]
    steps += [t["step"] for t in (rep.get("checkpoint") or {}).get("tags") or []
              if t.get("verdict") == "safe" and t.get("step") is not None]
    return max(steps, default=None)


def boundary(before: dict, after: dict) -> dict:
    """Rule 3: did AFTER get past the step where BEFORE failed, then one optimizer step and one save more?"""
    lb = last_step(before)
    if lb is None and (before.get("first_failure") or {}).get("phase") == "init":
        lb = 0
    la = last_step(after)
    ck = after.get("checkpoint") or {}
    out = {"before_last_step": lb, "failing_step": None if lb is None else lb + 1, "after_last_step": la,
           "passed_failing_step": None, "optimizer_step_after": None, "checkpoint_after": None,
           "after_checkpoint": {k: ck.get(k) for k in ("verdict", "resume_from", "reason", "disk_path")}, "passed": False}
    if lb is None:
        return out
    out["passed_failing_step"] = la is not None and la > lb
    out["optimizer_step_after"] = la is not None and la >= lb + 2
    saved = [t for t in ck.get("tags") or [] if t.get("verdict") == "safe" and (t.get("step") or 0) > lb]
    out["checkpoint_after"] = max(saved, key=lambda t: t["step"])["tag"] if saved else None
    out["passed"] = bool(out["passed_failing_step"] and out["optimizer_step_after"] and out["checkpoint_after"])
    return out


def _side(rep: dict, source: dict) -> dict:
    ff = rep.get("first_failure")
    return {
        "source": source,
        "job": rep.get("job"),
        "failed": ff is not None,
        "first_failure": None if ff is None else {
            k: ff.get(k) for k in ("rank", "node", "signature", "fingerprint", "category", "phase", "summary",
                                   "occurred_at", "inferred")},
        "blame": rep.get("blame"),
        "last_step": last_step(rep),
        "checkpoint": {k: (rep.get("checkpoint") or {}).get(k) for k in ("verdict", "resume_from", "reason")},
        "partial": rep.get("partial", False),
    }


def _changes_text(ch: dict) -> str:
    rows = {r["field"]: r for r in ch["fields"]}
    parts = []
    for f in ch["changed"]:
        r = rows[f]
        if "diff" in r:
            d = r["diff"]
            what = "; ".join(filter(None, [f"without {shlex.join(d['removed'])}" if d["removed"] else "",
                                           f"with {shlex.join(d['added'])}" if d["added"] else ""]))
            parts.append(f"the launch command ({what})")
        else:
            parts.append(f"{r['label']} {show(r['before'])} -> {show(r['after'])}")
    return ", ".join(parts)


def _reason(code: str, text: str) -> dict:
    return {"code": code, "text": text}


def _boundary_reasons(bd: dict) -> list[dict]:
    """Why AFTER's progress does not prove the failure gone (rule 3); empty when it does."""
    if bd["before_last_step"] is None:
        return [_reason("failing-step-unknown", "BEFORE's logs show no step it completed, so the step where it "
                                                "failed is unknown.")]
    if not bd["passed_failing_step"]:
        got = ("completed no step" if bd["after_last_step"] is None
               else f"stopped after step {bd['after_last_step']}")
        return [_reason("stopped-early", f"AFTER {got}, before step {bd['failing_step']} where BEFORE failed: "
                                         "the failure had no chance to come back.")]
    out = []
    if not bd["optimizer_step_after"]:
        out.append(_reason("no-step-after", f"AFTER completed step {bd['failing_step']} but no optimizer step after it."))
    if not bd["checkpoint_after"]:
        ck = bd["after_checkpoint"]
        hint = "" if ck.get("disk_path") else "; its checkpoint folder was not checked on disk"
        out.append(_reason("no-save-after", f"AFTER has no complete checkpoint saved at step {bd['failing_step']} or "
                                            f"later (its checkpoint verdict: {ck['verdict']}{hint})."))
    return out


def compare_reports(before: dict, after: dict, *, before_source: dict | None = None,
                    after_source: dict | None = None, generated_at: str | None = None) -> dict:
    """The compare object (docs/COMPARE.md) of two reports."""
    ch = diff_fields(before, after)
    init = _initiating(before)
    ranks, unranked = rank_matches(init, before, after)
    bd = boundary(before, after)
    against: list[dict] = []  # what keeps the verdict from "fixed"
    support: list[dict] = []  # what speaks for it
    notes: list[dict] = []
    came_back = [r for r, v in ranks.items() if v["initiating_in_after"]]
    aff = after.get("first_failure")
    if init is None:
        against.append(_reason("before-did-not-fail", "BEFORE shows no failure, so there is nothing for AFTER to fix."))
    elif came_back or unranked:
        how = {v["initiating_in_after"] for r, v in ranks.items() if r in came_back} | set(unranked)
        where = f"on rank{'s' if len(came_back) > 1 else ''} {', '.join(came_back)}" if came_back else "on no rank"
        same = "with the same message" if "same-fingerprint" in how else "with another message"
        against.append(_reason("came-back", f"BEFORE's initiating failure ({init['signature']}) came back in AFTER "
                                            f"{where}, {same}."))
    else:
        against += _boundary_reasons(bd)
        if bd["passed_failing_step"]:
            support.append(_reason("gone", f"BEFORE's initiating failure ({init['signature']}, rank {init['rank']}) "
                                           "appears on no rank of AFTER."))
        if bd["passed"]:
            support.append(_reason("boundary-passed", f"AFTER passed step {bd['failing_step']}, where BEFORE failed, "
                                                      f"reached step {bd['after_last_step']} and saved "
                                                      f"{bd['checkpoint_after']} completely."))
        if ch["count"] > 1:
            against.append(_reason("too-many-changes", f"{ch['count']} things changed at once: {_changes_text(ch)}; "
                                                       "a retry that changes one of them shows which one matters."))
        elif ch["count"] == 1:
            support.append(_reason("one-change", f"Exactly one thing changed: {_changes_text(ch)}."))
        else:
            notes.append(_reason("no-change-seen", "No setting the logs show changed: the change lies in code, data "
                                                   "or environment they do not show; had nothing changed, the "
                                                   "failure may come and go."))
    if init is not None and (came_back or unranked):
        verdict = "not-fixed"
    else:
        verdict = "inconclusive" if against else "fixed"
    if ch["not_comparable"]:
        notes.append(_reason("not-comparable", "Only one run shows: " + ", ".join(
            one_side(r) for r in ch["fields"] if r["status"] == "one-side") + "; whether it changed is unknown."))
    if aff and verdict != "not-fixed":
        notes.append(_reason("after-failed", f"AFTER failed otherwise: {aff.get('summary') or aff.get('signature')}"))
    return {
        "schema": SCHEMA,
        "generated_at": generated_at,
        "verdict": verdict,
        "reasons": against + support,
        "notes": notes,
        "before": _side(before, before_source or {}),
        "after": _side(after, after_source or {}),
        "changes": ch,
        "initiating": init,
        "came_back": bool(came_back or unranked),
        "came_back_unranked": unranked,
        "ranks": ranks,
        "boundary": bd,
    }
