import threading

from firstfault.agent.osthread import name_this_thread


def _comm(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().rstrip("\n")


def test_the_kernel_sees_the_threads_python_name_cut_to_15_bytes():
    seen = {}

    def body():
        name_this_thread()
        seen["default"] = _comm(threading.get_native_id())
        name_this_thread("ff-a-name-longer-than-fifteen")
        seen["long"] = _comm(threading.get_native_id())

    t = threading.Thread(target=body, name="ff-ranklog")
    t.start()
    t.join()
    assert seen == {"default": "ff-ranklog", "long": "ff-a-name-longe"}
