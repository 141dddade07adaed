import json

def read_config(text):
    return json.loads(text)

def init_process_group(text):
    try:
        cfg = read_config(text)
    except json.JSONDecodeError:
        cfg = None
    try:
        return cfg["master_port"]
    except TypeError:
        raise RuntimeError("could not read master_port from config")

def main():
    init_process_group('{"master_port": 29500')

main()
