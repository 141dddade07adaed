import faulthandler, os

faulthandler.enable()

def nccl_abort(reason):
    os.abort()

def all_reduce(step):
    nccl_abort("watchdog timeout")

all_reduce(7)
