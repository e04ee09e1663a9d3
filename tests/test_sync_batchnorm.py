"""Issue 47, point 2: `sync_batchnorm` (BatchNorm over every DDP process's batch), PyTorch's layer on CUDA and the
workbook's `CpuSyncBatchNorm` on CPU, and notebook 05's section 7 (its table and claim)."""
import pytest
import torch

from course_lib import paths
from course_lib.chapters import sync_bn_study
from course_lib.config import ConfigError, make_config
from course_lib.engine import ddp, ddp_probe, sync_batchnorm


def test_the_cpu_layer_is_batchnorm_without_a_process_group():
    torch.manual_seed(0)
    plain = torch.nn.BatchNorm2d(3)
    synced = sync_batchnorm.convert(torch.nn.Sequential(torch.nn.BatchNorm2d(3)), torch.device("cpu"))[0]
    synced.load_state_dict(plain.state_dict())
    images = torch.randn(4, 3, 5, 5)
    assert isinstance(synced, sync_batchnorm.CpuSyncBatchNorm)
    assert torch.allclose(synced(images), plain(images), atol=1e-6)
    assert torch.allclose(synced.running_var, plain.running_var)


def test_conversion_keeps_the_parameters_buffers_and_state_dict_keys():
    model = ddp_probe.small_cnn(batchnorm=True)
    before = {name: tensor for name, tensor in model.state_dict().items()}
    weight = model[1].weight
    converted = sync_batchnorm.convert(model, torch.device("cpu"))
    assert sync_batchnorm.count_synced(converted) == 2
    assert converted[1].weight is weight  # the optimizer's tensors are the layer's
    assert converted.state_dict().keys() == before.keys()
    assert sync_batchnorm.count_synced(ddp_probe.small_cnn()) == 0


def test_the_statistics_equal_batchnorm_over_the_whole_batch(monkeypatch):
    """Two "processes" simulated in one: the all-reduce sums the halves' sums, as gloo would."""
    import torch.distributed.nn.functional as dist_functional

    torch.manual_seed(1)
    whole = torch.randn(8, 3, 4, 4) * 2 + 1
    halves = whole.chunk(2)
    layer = sync_batchnorm.CpuSyncBatchNorm(3)
    reference = torch.nn.BatchNorm2d(3)
    other_half_sums = {}

    def all_reduce(tensor):
        values = halves[1].float()
        dims = [0, 2, 3]
        other = torch.cat([values.sum(dims), (values * values).sum(dims),
                           torch.tensor([halves[1].numel() / 3.0])])
        other_half_sums["seen"] = True
        return tensor + other

    monkeypatch.setattr(sync_batchnorm, "_syncing", lambda: True)
    monkeypatch.setattr(dist_functional, "all_reduce", all_reduce)
    out = layer(halves[0])
    expected = reference(whole)[:4]
    assert other_half_sums and torch.allclose(out, expected, atol=1e-5)
    assert torch.allclose(layer.running_mean, reference.running_mean, atol=1e-6)
    assert torch.allclose(layer.running_var, reference.running_var, atol=1e-5)  # unbiased over all 8 x 16 values


def test_one_process_logs_that_there_is_nothing_to_synchronise(capsys):
    from course_lib.engine import train

    config = make_config("smoke", sync_batchnorm=True, max_steps=1, epochs=1)
    state = train.prepare(config, verbose=True)
    assert sync_batchnorm.count_synced(state.raw_model) == 0
    assert "sync_batchnorm: one process" in capsys.readouterr().out


@pytest.mark.torchrun
def test_two_workers_with_synced_batchnorm_equal_one_worker_on_gloo():
    """With BatchNorm synchronised, DDP's statistics are the global batch's: the weights and the running
    statistics equal one worker's on the same global batches. Without the switch they would not."""
    result = ddp.check_equivalence(2, {"batch_size": 8, "sync_batchnorm": True}, "smoke", steps=3, echo=None,
                                   timeout=120, tolerance=1e-4)
    assert result["equal"], result["max_abs_difference"]
    assert result["weights_moved"] > 100 * result["tolerance"]


def test_the_sections_plan_table_and_claim():
    from course_lib.analysis import claims

    config = make_config("smoke")
    launches, batches, seeds = sync_bn_study.plan(config, "cpu")
    assert batches == [2, 4, 8, 32] and seeds == [0] and launches.model == "speedrun_resnet_tiny"
    assert sync_bn_study.plan(config, "cpu", "2, 16")[1] == [2, 16]
    real = paths.DataChoice({"dataset": "imagefolder", "data_dir": "/tmp/eurosat"}, "eurosat", "a test", False)
    assert sync_bn_study.plan(config, "cpu", "", real)[0].data_dir == "/tmp/eurosat"
    assert sync_bn_study.plan(config, "cpu", "none")[1] == []
    for bad in ("two", "0,4"):
        with pytest.raises(ConfigError, match="sync_bn_batches"):
            sync_bn_study.plan(config, "cpu", bad)

    def rows(gain_at_2, seeds=(0, 1, 2)):
        made = []
        for seed in seeds:
            for batch in (2, 32):
                for synced in (False, True):
                    top1 = 0.70 + 0.01 * seed + (gain_at_2 if synced and batch == 2 else 0.0)
                    made.append({"per-process batch": batch, "sync_batchnorm": synced, "seed": seed,
                                 "global batch": 2 * batch, "val top-1": top1,
                                 "step ms": 10.0 * batch * (1.3 if synced else 1.0)})
        return made

    table = sync_bn_study.table(rows(0.03))
    assert table.loc[2, "synced minus own (points)"] == pytest.approx(3.0)
    assert table.loc[32, "step time synced / own"] == pytest.approx(1.3)
    assert sync_bn_study.claim(rows(0.03), real, hardware="test").verdict == claims.HOLDS
    assert sync_bn_study.claim(rows(0.0), real, hardware="test").verdict == claims.REFUTED
    assert sync_bn_study.claim(rows(-0.03), real, hardware="test").verdict == claims.REFUTED
    one = sync_bn_study.claim(rows(0.03, seeds=(0,)), real, hardware="test")
    assert one.verdict == claims.NOT_SHOWN and "one seed" in one.reason and "eurosat" in one.reason
    generated = sync_bn_study.claim(rows(0.03), paths.choose_data("cpu", find_real=False), hardware="test")
    assert generated.verdict == claims.NOT_MEASURABLE and "generated" in generated.reason
