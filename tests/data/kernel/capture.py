"""Capture the real kernel-log fixtures in this folder (run as root: python3 capture.py).

Nothing here is hand-written output: every file is what the kernel, dmesg,
systemd-journal-remote or journalctl printed. See README.md for what each file holds.

Windows (each a range of /dev/kmsg sequence numbers):
  memcg-oom   a python3 process killed by the real memcg OOM killer (cgroup v1, 64M)
  nvrm        NVIDIA-driver-shaped lines written into /dev/kmsg by root
  segfault    a real `python3 -c "import ctypes; ctypes.string_at(0)"` segfault
  misc        root-written records with an embedded newline, a non-UTF-8 byte, ESC, backslash
  boot        records already in the buffer from boot that carry SUBSYSTEM=/DEVICE= lines
"""

import json
import os
import platform
import re
import resource
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CG = f"/sys/fs/cgroup/memory/ff-kcap-{os.getpid()}"

NVRM_LINES = [
    # Shapes from the driver sources (open-gpu-kernel-modules kernel_rc.c:
    # "NVRM: GPU at PCI:%04x:%02x:%02x: %s", "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s",
    # nv.h NV_DEV_PRINTF "NVRM: GPU %04x:%02x:%02x.%x: ", nvswitch "nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, ")
    # and from messages quoted in public bug reports; pr_err level (3) like the driver's nv_printf.
    "<3>NVRM: GPU at PCI:0000:3b:00: GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d",
    "<3>NVRM: GPU Board Serial Number: 1650121012345",
    "<3>NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    "<3>NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x57c730=0xc04000b 0x57c734=0x24 0x57c728=0x1f81fb60 0x57c72c=0x1174",
    "<3>NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python, Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f29_5b8c9000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    "<3>NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 31, pid=1234, name=python, Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f29_5b8c9000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    "<3>NVRM: Xid (PCI:0000:3b:00): 45, pid=1234, name=python, Ch 00000008",
    "<3>NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 3, subpartition 0.",
    "<3>NVRM: Xid (PCI:0000:3b:00): 63, pid=1234, name=python, Row Remapper: New row (0x0000000e9b9107e0) marked for remapping, reset gpu to activate.",
    "<3>NVRM: Xid (PCI:0000:3b:00): 94, pid=1234, name=python, Contained: SM (0x1). RST: No, D-RST: No",
    "<3>NVRM: Xid (PCI:0000:3b:00): 95, pid=1234, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No",
    "<3>NVRM: Xid (PCI:0000:3b:00): 119, pid=1234, name=python, Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
    "<3>NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "<3>NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    "<3>nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
]

MISC_RECORDS = [
    b"<6>ff-kcap multi-line record: first line\nsecond line",
    b"<6>ff-kcap non-UTF-8 byte \xff and ESC \x1b[0m in one record",
    b"<6>ff-kcap backslash C:\\path and tab\there",
]


def kmsg_records(after_seq=-1):
    """Every record now in the buffer with seq > after_seq, as raw bytes of one read()."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        while True:
            try:
                rec = os.read(fd, 16384)
            except BlockingIOError:
                break
            except BrokenPipeError:  # records overwritten under us: keep reading
                continue
            if int(rec.split(b",", 2)[1]) > after_seq:
                out.append(rec)
    finally:
        os.close(fd)
    return out


def last_seq():
    recs = kmsg_records()
    return int(recs[-1].split(b",", 2)[1])


def write_kmsg(data: bytes):
    # One open per write: the kernel allows 10 writes per open file per 5 s.
    with open("/dev/kmsg", "wb", buffering=0) as f:
        f.write(data)


def memcg_oom(meta):
    os.mkdir(CG)
    try:
        with open(f"{CG}/memory.limit_in_bytes", "w") as f:
            f.write("64M")
        before = last_seq()
        code = "b = []\nwhile True:\n    b.append(b'\\x01' * (1 << 20))\n"
        p = subprocess.Popen(
            ["sh", "-c", f'echo $$ > {CG}/cgroup.procs && exec python3 -c "$0"', code])
        rc = p.wait(timeout=60)
        time.sleep(0.5)
        with open(f"{CG}/memory.oom_control") as f:
            oom_control = f.read()
        with open(os.path.join(HERE, "memcg-oom.oom_control"), "w") as f:
            f.write(oom_control)
        meta["memcg-oom"] = {"before_seq": before, "pid": p.pid, "returncode": rc, "cgroup": CG}
    finally:
        os.rmdir(CG)
    return before


def nvrm(meta):
    before = last_seq()
    for line in NVRM_LINES:
        write_kmsg(line.encode() + b"\n")
    meta["nvrm"] = {"before_seq": before}
    return before


def segfault(meta):
    before = last_seq()
    rc = subprocess.run(
        ["python3", "-c", "import ctypes; ctypes.string_at(0)"],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))).returncode
    time.sleep(0.3)
    meta["segfault"] = {"before_seq": before, "returncode": rc}
    return before


def misc(meta):
    before = last_seq()
    for rec in MISC_RECORDS:
        write_kmsg(rec + b"\n")
    meta["misc"] = {"before_seq": before}
    return before


def seq_of(rec):
    return int(rec.split(b",", 2)[1])


def usec_of(rec):
    return int(rec.split(b",", 3)[2])


STAMP = re.compile(r"^(?:<\d+>)?\[\s*(\d+)\.(\d{6})\]")


def main():
    if os.geteuid() != 0:
        sys.exit("run as root")
    meta = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "kernel": platform.release(),
        "hostname": socket.gethostname(),
        "boot_id": open("/proc/sys/kernel/random/boot_id").read().strip(),
        "machine_id": open("/etc/machine-id").read().strip(),
        "util_linux": subprocess.run(["dmesg", "--version"], capture_output=True, text=True).stdout.strip(),
        "systemd": subprocess.run(["journalctl", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "tz": time.strftime("%Z"),
        # what dmesg -T does: wall clock minus CLOCK_BOOTTIME (float seconds; fractions kept here)
        "boot_wall_ns": time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME),
    }
    windows = {}  # name -> list of raw records
    befores = {"memcg-oom": memcg_oom(meta)}
    windows["memcg-oom"] = [r for r in kmsg_records(befores["memcg-oom"])]
    befores["nvrm"] = nvrm(meta)
    windows["nvrm"] = kmsg_records(befores["nvrm"])
    befores["segfault"] = segfault(meta)
    windows["segfault"] = kmsg_records(befores["segfault"])
    befores["misc"] = misc(meta)
    windows["misc"] = kmsg_records(befores["misc"])
    # Cut each window at the next window's start (records are read again above).
    names = list(windows)
    for a, b in zip(names, names[1:]):
        windows[a] = [r for r in windows[a] if seq_of(r) <= befores[b]]
    # Boot records with dictionary (continuation) lines: the first device records.
    boot_all = kmsg_records()
    dict_seqs = [seq_of(r) for r in boot_all if b"\n SUBSYSTEM=" in r and seq_of(r) >= 260][:1]
    start = dict_seqs[0] if dict_seqs else 0
    windows["boot"] = [r for r in boot_all if start <= seq_of(r) < start + 20]
    meta["boot"] = {"first_seq": start}

    # dmesg in its four time formats, once, back to back; then check nothing arrived meanwhile.
    outs = {}
    for suffix, args in (("dmesg", []), ("dmesg-T", ["-T"]), ("dmesg-r", ["-r"]),
                         ("dmesg-iso", ["--time-format", "iso"])):
        outs[suffix] = subprocess.run(["dmesg", *args], capture_output=True, check=True).stdout.split(b"\n")[:-1]
    meta["dmesg_commands"] = {"dmesg": "dmesg", "dmesg-T": "dmesg -T", "dmesg-r": "dmesg -r",
                              "dmesg-iso": "dmesg --time-format iso"}
    n = {k: len(v) for k, v in outs.items()}
    if len(set(n.values())) != 1:
        sys.exit(f"dmesg outputs differ in length {n}: rerun")
    plain = outs["dmesg"]
    for name, recs in windows.items():
        usecs = {usec_of(r) for r in recs}
        idx, keep = [], False
        for i, line in enumerate(plain):
            m = STAMP.match(line.decode("utf-8", "replace"))
            if m:
                keep = int(m.group(1)) * 1_000_000 + int(m.group(2)) in usecs
            if keep:
                idx.append(i)
        with open(os.path.join(HERE, f"{name}.kmsg"), "wb") as f:
            f.write(b"".join(recs))
        for suffix, lines in outs.items():
            with open(os.path.join(HERE, f"{name}.{suffix}"), "wb") as f:
                f.write(b"".join(lines[i] + b"\n" for i in idx))
        meta.setdefault(name, {}).update(
            {"seqs": [seq_of(recs[0]), seq_of(recs[-1])], "records": len(recs), "dmesg_lines": len(idx)})
    with open(os.path.join(HERE, "capture-meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
