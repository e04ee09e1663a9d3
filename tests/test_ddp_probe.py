"""The DDP probe worker (`engine.ddp_probe`): each rank's batches, and the all-reduce events the
profiler sees."""
import torch
import torch.distributed as dist

from course_lib.engine import ddp_probe


def test_the_ranks_batches_together_hold_the_single_worker_batch():
    shards = [ddp_probe.rank_batches(64, 2, rank, 8) for rank in (0, 1)]
    assert len(shards[0]) == 4 and all(len(batch) == 8 for batch in shards[0])
    assert {i for batch in shards[0] for i in batch}.isdisjoint(i for batch in shards[1] for i in batch)
    single = ddp_probe.rank_batches(64, 1, 0, 16)  # 1 worker, global batch 16
    for step in range(4):
        assert sorted(shards[0][step] + shards[1][step]) == sorted(single[step])


def test_profiler_sees_the_gloo_all_reduce_once(tmp_path):
    """One process, world size 1: gloo still runs (and the profiler records) an all-reduce."""
    from torch.profiler import ProfilerActivity, profile

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            tensor = torch.ones(1000)
            dist.all_reduce(tensor)
        events = ddp_probe.communication_events(profiler)
    finally:
        dist.destroy_process_group()
    assert events["event_names"] == ["gloo:all_reduce"]  # not also the enclosing c10d::allreduce_
    assert events["cpu_seconds"] > 0
