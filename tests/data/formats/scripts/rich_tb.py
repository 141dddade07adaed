import sys

from rich.traceback import install

install(show_locals="--locals" in sys.argv)


def all_reduce(tensor, world_size):
    return [t / world_size for t in tensor]


def train_step(step, grads):
    world_size = 0 if step == 3 else 8
    return all_reduce(grads, world_size)


def main():
    grads = [0.5, 1.5, 2.5]
    for step in range(1, 5):
        if "--chain" in sys.argv:
            try:
                train_step(step, grads)
            except ZeroDivisionError as e:
                raise RuntimeError(f"step {step} failed on rank 0") from e
        else:
            train_step(step, grads)


if __name__ == "__main__":
    main()
