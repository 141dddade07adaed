"""Make a real journal file from the captured kmsg records and capture journalctl's outputs.

journald does not run on the capture machine, so the journal file is written by
systemd-journal-remote from the journal export format built here, field for field
the way journald's kmsg reader (journald-kmsg.c) stores a kernel record:
_TRANSPORT=kernel, SYSLOG_IDENTIFIER=kernel, PRIORITY/SYSLOG_FACILITY from the
record's prio, _SOURCE_MONOTONIC_TIMESTAMP = the record's usec, the \\xNN escapes
undone in MESSAGE, SUBSYSTEM=/DEVICE= continuation lines as _KERNEL_SUBSYSTEM /
_KERNEL_DEVICE. Journald stamps __REALTIME_TIMESTAMP when it reads the record; here it
is boot_wall + usec (what a journald reading promptly would store).

Run after capture.py, on the same boot (journalctl -k keeps to the current boot):
    python3 capture_journal.py
"""

import json
import os
import re
import struct
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WINDOWS = ["boot", "memcg-oom", "nvrm", "segfault", "misc"]
OUTPUTS = {  # file suffix -> journalctl -o mode
    "short": "short", "short-iso": "short-iso", "short-precise": "short-precise",
    "short-iso-precise": "short-iso-precise", "json": "json", "export": "export",
}


def unescape(text: bytes) -> bytes:
    return re.sub(rb"\\x([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), text)


def field(name: str, value: bytes) -> bytes:
    printable = all(b >= 0x20 or b == 0x09 for b in value) and b"\x7f" not in value
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        printable = False
    if printable:
        return name.encode() + b"=" + value + b"\n"
    return name.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"


def main():
    meta = json.load(open(os.path.join(HERE, "capture-meta.json")))
    boot_wall_us = meta["boot_wall_ns"] // 1000
    out = []
    for w in WINDOWS:
        data = open(os.path.join(HERE, f"{w}.kmsg"), "rb").read()
        for rec in re.split(rb"\n(?! )", data.rstrip(b"\n")):
            head, _, rest = rec.partition(b";")
            prio, seq, usec = (int(x) for x in head.split(b",")[:3])
            text, *cont = rest.split(b"\n")
            entry = [
                field("__REALTIME_TIMESTAMP", str(boot_wall_us + usec).encode()),
                field("__MONOTONIC_TIMESTAMP", str(usec).encode()),
                field("_BOOT_ID", meta["boot_id"].replace("-", "").encode()),
                field("_MACHINE_ID", meta["machine_id"].encode()),
                field("_HOSTNAME", meta["hostname"].encode()),
                field("_TRANSPORT", b"kernel"),
                field("PRIORITY", str(prio & 7).encode()),
                field("SYSLOG_FACILITY", str(prio >> 3).encode()),
                field("SYSLOG_IDENTIFIER", b"kernel"),
                field("_SOURCE_MONOTONIC_TIMESTAMP", str(usec).encode()),
            ]
            for line in cont:
                k, _, v = line[1:].partition(b"=")
                if k in (b"SUBSYSTEM", b"DEVICE"):
                    entry.append(field("_KERNEL_" + k.decode(), v))
            entry.append(field("MESSAGE", unescape(text)))
            out.append(b"".join(entry))
    export = b"\n".join(out) + b"\n"
    with open(os.path.join(HERE, "journal-input.export"), "wb") as f:
        f.write(export)
    with tempfile.TemporaryDirectory() as tmp:
        jf = os.path.join(tmp, "kernel.journal")
        subprocess.run(["/lib/systemd/systemd-journal-remote", f"--output={jf}", "-"],
                       input=export, check=True)
        for suffix, mode in OUTPUTS.items():
            res = subprocess.run(["journalctl", "--no-pager", "--file", jf, "-k", "-o", mode],
                                 capture_output=True, check=True)
            with open(os.path.join(HERE, f"journal.{suffix}"), "wb") as f:
                f.write(res.stdout)
        print(os.path.getsize(jf), "bytes of journal file (not kept)")


if __name__ == "__main__":
    main()
