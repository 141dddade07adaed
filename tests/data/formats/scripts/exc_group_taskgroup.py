import asyncio

async def worker(rank):
    await asyncio.sleep(0.01)
    if rank == 1:
        raise ConnectionError(f"rank {rank}: connection reset by peer")
    if rank == 3:
        raise TimeoutError(f"rank {rank}: barrier timed out")
    return rank

async def main():
    async with asyncio.TaskGroup() as tg:
        for r in range(4):
            tg.create_task(worker(r))

asyncio.run(main())
