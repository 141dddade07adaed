class CheckpointError(Exception):
    pass

def open_checkpoint(path):
    with open(path, "rb") as f:
        return f.read()

def load_checkpoint(step):
    path = f"/nonexistent/checkpoints/global_step{step}/mp_rank_00_model_states.pt"
    try:
        return open_checkpoint(path)
    except OSError as e:
        raise CheckpointError(f"failed to load checkpoint for step {step}") from e

if __name__ == "__main__":
    load_checkpoint(1200)
