import ctypes, faulthandler, threading, time

faulthandler.enable()

def heartbeat(stop):
    while not stop.is_set():
        time.sleep(0.01)

def copy_tensor_to_device(ptr):
    return ctypes.string_at(ptr, 16)

def forward(step):
    return copy_tensor_to_device(0xdeadbeef000)

stop = threading.Event()
threading.Thread(target=heartbeat, args=(stop,), name="heartbeat").start()
time.sleep(0.1)
forward(3)
