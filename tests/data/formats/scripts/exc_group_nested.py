def check_ranks():
    errors = []
    for rank in range(3):
        try:
            if rank != 0:
                raise ValueError(f"rank {rank} reported nan loss")
        except ValueError as e:
            errors.append(e)
    try:
        raise KeyError("optimizer_state")
    except KeyError as e:
        inner = ExceptionGroup("optimizer errors", [e])
    raise ExceptionGroup("step 3 failed on 2 ranks", errors + [inner])

check_ranks()
