import os, signal, threading, time

def training_loop():
    step = 0
    while True:
        step += 1
        time.sleep(0.05)

threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
training_loop()
