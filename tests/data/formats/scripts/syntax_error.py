import os

def get_world_size():
    return int(os.environ.get("WORLD_SIZE", "1")

print(get_world_size())
