import faulthandler, sys, threading, time

def data_loader_worker(stop):
    while not stop.is_set():
        time.sleep(0.01)

def wait_for_collective(stop):
    stop.wait()

def main():
    stop = threading.Event()
    threads = [threading.Thread(target=data_loader_worker, args=(stop,), name="loader"),
               threading.Thread(target=wait_for_collective, args=(stop,), name="nccl-wait")]
    for t in threads:
        t.start()
    time.sleep(0.2)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    stop.set()
    for t in threads:
        t.join()

main()
