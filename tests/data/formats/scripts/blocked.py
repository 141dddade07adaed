import threading
import time


def prefetch_batches(stop):
    while not stop.is_set():
        time.sleep(0.05)


def spin_on_flag(stop):
    # Busy-polls like a progress thread, so py-spy reports it as active.
    n = 0
    while not stop.is_set():
        n += 1


def wait_for_allreduce(work, timeout_s):
    # Stands in for a rank stuck waiting on a collective that never completes.
    work.wait(timeout_s)


def train_step(step, work):
    grads = [0.1 * step] * 4
    wait_for_allreduce(work, timeout_s=600)
    return grads


def main():
    stop = threading.Event()
    loader = threading.Thread(target=prefetch_batches, args=(stop,), name="prefetch")
    spinner = threading.Thread(target=spin_on_flag, args=(stop,), name="progress")
    loader.start()
    spinner.start()
    print("ready", flush=True)
    try:
        train_step(3, threading.Event())
    finally:
        stop.set()


if __name__ == "__main__":
    main()
