"""DeepSeek's group-limited routing (HF n_group / topk_group, MaxText n_routing_groups / topk_routing_group)
is a model setting in every bridge: it reaches config.json, Megatron's args and flags, TorchTitan's notes and
the reference forward, and a run that routes so converts to an HF model that routes the same way."""

from __future__ import annotations

import json

import pytest

from maxckpt.formats import MegatronOptions
from maxckpt.conversion.options import SourceOptions
from maxckpt.conversion import convert, open_checkpoint
from maxckpt.conversion.verify import verify_logits
from maxckpt.errors import ConfigError, UnsupportedModelError

GROUPED = {"num_experts_per_tok": 2, "n_routing_groups": 2, "topk_routing_group": 1}  # MaxText's names


def _src(maxtext_fixtures):
    return maxtext_fixtures / "deepseek3_scan" / "checkpoints" / "5" / "items"


def test_grouped_routing_reaches_hf_and_routes_as_the_reference(maxtext_fixtures, tmp_path):
    src = _src(maxtext_fixtures)
    report = convert(src, tmp_path / "hf", to="hf", model="deepseek3-671b", source=SourceOptions(overrides=GROUPED))
    assert (report.spec.n_group, report.spec.topk_group) == (2, 1)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["n_group"], config["topk_group"]) == (2, 1)
    same = verify_logits(src, tmp_path / "hf", model="deepseek3-671b", source=SourceOptions(overrides=GROUPED))
    assert same.ok, same
    # The setting matters: MaxText's forward without groups gives other logits than this HF model.
    other = verify_logits(src, tmp_path / "hf", model="deepseek3-671b", source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    assert not other.ok
    # HF -> MaxText -> HF keeps it, read from config.json alone.
    convert(tmp_path / "hf", tmp_path / "mt", to="maxtext")
    with open_checkpoint(tmp_path / "hf") as ckpt:
        assert (ckpt.spec.n_group, ckpt.spec.topk_group) == (2, 1)


def test_grouped_routing_reaches_megatron_and_torchtitan(maxtext_fixtures, tmp_path):
    from maxckpt.formats.megatron.args import megatron_cli_flags
    from maxckpt.formats.megatron.layout import MegatronLayout

    src = _src(maxtext_fixtures)
    report = convert(src, tmp_path / "mcore", to="megatron", model="deepseek3-671b", options=MegatronOptions(spec="local"), source=SourceOptions(overrides=GROUPED))
    convert(tmp_path / "mcore", tmp_path / "hf", to="hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["n_group"], config["topk_group"]) == (2, 1)
    flags = " ".join(megatron_cli_flags(report.spec, MegatronLayout(spec="local")))
    assert "--moe-router-num-groups 2 --moe-router-group-topk 1" in flags
    from maxckpt.formats.torchtitan.notes import torchtitan_model_notes

    note = torchtitan_model_notes(report.spec)[0]
    assert "deepseek_v3" in note and "router_num_expert_groups 2, router_num_limited_groups 1" in note


def test_routing_megatron_cannot_express_is_refused(maxtext_fixtures, tmp_path):
    """Megatron scores a group by its top topk // group_topk experts, DeepSeek by its top 2."""
    settings = {"num_experts_per_tok": 1, "n_routing_groups": 2, "topk_routing_group": 1}
    with pytest.raises(UnsupportedModelError, match="Megatron-Core scores each group"):
        convert(_src(maxtext_fixtures), tmp_path / "mcore", to="megatron", model="deepseek3-671b",
                options=MegatronOptions(spec="local"), source=SourceOptions(overrides=settings))
    assert not (tmp_path / "mcore").exists()


@pytest.mark.parametrize("settings, match", [
    ({"num_experts_per_tok": 2, "n_group": 3, "topk_group": 1}, "n_group must divide"),
    ({"num_experts_per_tok": 2, "n_group": 2, "topk_group": 3}, "topk_group <= n_group"),
    ({"num_experts_per_tok": 4, "n_group": 4, "topk_group": 1}, "at least top-k experts"),
    ({"num_experts_per_tok": 2, "n_group": 0}, "n_group must be a positive whole number"),
    ({"num_experts_per_tok": 2, "n_routing_groups": 2, "n_group": 4}, "twice with different values"),
])
def test_routing_groups_that_do_not_fit_are_refused(maxtext_fixtures, tmp_path, settings, match):
    with pytest.raises(ConfigError, match=match):
        convert(_src(maxtext_fixtures), tmp_path / "hf", to="hf", model="deepseek3-671b", source=SourceOptions(overrides=settings))
    assert not (tmp_path / "hf").exists()


def test_routing_groups_on_a_family_without_them_are_refused(maxtext_fixtures, tmp_path):
    src = maxtext_fixtures / "mixtral_moe_scan" / "checkpoints" / "5" / "items"
    with pytest.raises(ConfigError, match="only\\s+DeepSeek's sigmoid routing"):
        convert(src, tmp_path / "hf", to="hf", model="mixtral", source=SourceOptions(overrides={"num_experts_per_tok": 2, "n_group": 2}))


def test_maxtext_off_value_means_no_groups(maxtext_fixtures, tmp_path):
    report = convert(_src(maxtext_fixtures), tmp_path / "hf", to="hf", model="deepseek3-671b",
                     source=SourceOptions(overrides={"num_experts_per_tok": 2, "n_routing_groups": -1, "topk_routing_group": -1}))
    assert (report.spec.n_group, report.spec.topk_group) == (1, 1)
