"""Lookahead (engine/lookahead.py): the slow weights after k steps of SGD on a quadratic against the closed form,
the switch off leaving a run bit-identical, the end of training on the slow weights, and resume."""
import pytest
import torch
from conftest import CrashAfter, TensorImages, tiny_config

from course_lib.config import ConfigError, make_config
from course_lib.data.datasets import DataBundle
from course_lib.engine import train
from course_lib.engine.lookahead import Lookahead
from course_lib.models import checkpoint

CLASSES = [f"class{i}" for i in range(4)]


def _bundle(train_images=64):
    return DataBundle(TensorImages(train_images), TensorImages(16, seed=1), None, CLASSES, "tensors")


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("k, alpha", [(1, 0.5), (3, 0.5), (5, 0.8)])
def test_after_k_sgd_steps_the_slow_weights_move_alpha_of_the_way(k, alpha):
    """Plain SGD on f(w) = |w|^2 / 2 (gradient w): each step multiplies the fast weights by (1 - lr), so after k
    steps they are (1 - lr)^k slow0, and the sync makes slow = slow0 + alpha (fast_k - slow0)."""
    model = torch.nn.Linear(3, 2)
    slow0 = {name: p.detach().clone() for name, p in model.named_parameters()}
    lr = 0.1
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    lookahead = Lookahead(model, steps=k, alpha=alpha)
    for step in range(1, k + 1):
        loss = sum((p ** 2).sum() / 2 for p in model.parameters())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert lookahead.step(model, step) == (step == k)
    for name, p in model.named_parameters():
        fast_k = (1 - lr) ** k * slow0[name]
        expected = slow0[name] + alpha * (fast_k - slow0[name])
        assert lookahead.slow[name].flatten().tolist() == pytest.approx(expected.flatten().tolist(), rel=1e-5)
        assert torch.equal(p.detach(), lookahead.slow[name])  # the fast weights restart from the slow ones


def test_finish_puts_the_slow_weights_in_the_model():
    model = torch.nn.Linear(2, 2)
    lookahead = Lookahead(model, steps=5, alpha=0.5)
    slow = _weights(model)
    with torch.no_grad():
        model.weight.add_(1.0)  # fast steps since the last sync
    lookahead.finish(model)
    assert all(torch.equal(value, slow[name]) for name, value in _weights(model).items())


def test_off_by_default_changes_nothing(tmp_path):
    assert make_config("smoke").lookahead_steps == 0
    plain = train.fit(tiny_config(tmp_path / "a", epochs=2, max_steps=3), bundle=_bundle(), progress=False,
                      verbose=False)
    again = train.fit(tiny_config(tmp_path / "b", epochs=2, max_steps=3, lookahead_alpha=0.9), bundle=_bundle(),
                      progress=False, verbose=False)  # alpha alone does nothing while lookahead_steps is 0
    first, second = _weights(plain.model), _weights(again.model)
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_a_run_with_lookahead_trains_differently_and_ends_on_the_slow_weights(tmp_path):
    plain = train.fit(tiny_config(tmp_path / "a", max_steps=4), bundle=_bundle(), progress=False, verbose=False)
    # k=3 of 4 steps: the 4th step's fast weights are dropped at the end, so the model is the slow weights of step 3.
    config = tiny_config(tmp_path / "b", max_steps=4, lookahead_steps=3)
    state = train.prepare(config, _bundle(), verbose=False)
    train.train_one_epoch(state, 0, progress=False)
    assert all(torch.equal(state.raw_model.state_dict()[name], slow) for name, slow in state.lookahead.slow.items())
    assert not torch.equal(state.raw_model.fc.weight, plain.model.fc.weight)


def test_resume_restores_the_slow_weights_and_ends_with_the_uninterrupted_weights(tmp_path):
    config = tiny_config(tmp_path / "uninterrupted", epochs=3, max_steps=3, lookahead_steps=2, lookahead_alpha=0.5)
    bundle = _bundle()
    uninterrupted = train.fit(config, bundle=bundle, progress=False, verbose=False)
    interrupted = config.replace(output_dir=str(tmp_path / "interrupted"))
    crashing = DataBundle(CrashAfter(bundle.train, limit=16 * 3 + 20), bundle.val, None, bundle.classes, "crash")
    with pytest.raises(KeyboardInterrupt):  # dies in epoch 2, one step after a sync that epoch 1 left pending
        train.fit(interrupted, bundle=crashing, progress=False, verbose=False)
    saved = checkpoint.load_checkpoint(tmp_path / "interrupted" / "last.pt")
    assert saved["epoch"] == 1 and saved["lookahead"] is not None
    resumed = train.fit(interrupted.replace(resume=True), bundle=bundle, progress=False, verbose=False)
    first, second = _weights(uninterrupted.model), _weights(resumed.model)
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("values, field", [(dict(lookahead_steps=-1), "lookahead_steps"),
                                           (dict(lookahead_alpha=0.0), "lookahead_alpha"),
                                           (dict(lookahead_alpha=1.5), "lookahead_alpha")])
def test_a_bad_value_is_refused_in_one_line_naming_the_field(values, field):
    with pytest.raises(ConfigError, match=field) as error:
        make_config("smoke", **values)
    assert "\n" not in str(error.value)


def test_the_new_fields_at_their_old_behaviour_keep_the_digest_of_models_already_trained():
    config = make_config("smoke")
    new = ("muon_lr", "lookahead_steps", "lookahead_alpha")
    before = {key: value for key, value in config.to_dict().items() if key not in new}  # a Config of before
    assert checkpoint.config_digest(config.to_dict()) == checkpoint.config_digest(before)
    assert checkpoint.config_digest(config.replace(lookahead_steps=5).to_dict()) != checkpoint.config_digest(before)
    assert checkpoint.config_digest(config.replace(optimizer="muon").to_dict()) != checkpoint.config_digest(before)
