"""Calls libnccl (pip nvidia-nccl-cu12) directly through ctypes on a machine with no GPU, so that
NCCL itself prints its NCCL_DEBUG lines: bootstrap init, then the CUDA failure when a rank tries
ncclCommInitRank. usage: NCCL_DEBUG=INFO python nccl_init_nogpu.py /path/to/libnccl.so.2 NRANKS"""
import ctypes
import multiprocessing as mp
import sys


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def rank_main(lib_path, uid_bytes, rank, nranks):
    nccl = ctypes.CDLL(lib_path)
    uid = UniqueId()
    ctypes.memmove(ctypes.byref(uid), uid_bytes, 128)
    comm = ctypes.c_void_p()
    rc = nccl.ncclCommInitRank(ctypes.byref(comm), nranks, uid, rank)
    nccl.ncclGetErrorString.restype = ctypes.c_char_p
    nccl.ncclGetLastError.restype = ctypes.c_char_p
    print(f"rank {rank}: ncclCommInitRank returned {rc} ({nccl.ncclGetErrorString(rc).decode()}): "
          f"{nccl.ncclGetLastError(None).decode()}", flush=True)
    sys.exit(1 if rc else 0)


def main():
    lib_path, nranks = sys.argv[1], int(sys.argv[2])
    nccl = ctypes.CDLL(lib_path)
    version = ctypes.c_int()
    nccl.ncclGetVersion(ctypes.byref(version))
    print(f"ncclGetVersion: {version.value}", flush=True)
    uid = UniqueId()
    rc = nccl.ncclGetUniqueId(ctypes.byref(uid))
    print(f"ncclGetUniqueId returned {rc}", flush=True)
    procs = [mp.Process(target=rank_main, args=(lib_path, bytes(uid.internal), r, nranks)) for r in range(nranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


if __name__ == "__main__":
    mp.set_start_method("spawn")
    main()
