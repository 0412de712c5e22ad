"""MaxText's own trainer on maxckpt's manager: real MaxText 0.2.5 training runs on CPU.

Every test trains a tiny model with MaxText's pre-training entry point in a
Python 3.12 venv built by tests/maxtext_env.py (a missing Python 3.12 is an
error, not a skip). The 12-step run of `reference` is the yardstick: an
interrupted-and-resumed run, under maxckpt or plain MaxText, must end with
exactly its weights.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.maxtext_env import maxtext_python, run_env
from tests.maxtext_runs import (
    Run,
    args,
    assert_same_arrays,
    committed_steps,
    completed_steps,
    kill,
    layout,
    read_all,
    tmp_dirs,
    wait_for,
    write_overlay,
)

pytestmark = pytest.mark.slow

STEPS = 12
FINAL = STEPS - 1


@pytest.fixture(scope="module")
def mt_python() -> Path:
    return maxtext_python()


@pytest.fixture(scope="module")
def work(tmp_path_factory, mt_python) -> Run:
    """An overlay with MaxText keys only (plain MaxText reads it too), and a place for runs."""
    root = tmp_path_factory.mktemp("maxtext")
    out = root / "out"
    out.mkdir()
    return Run(mt_python, write_overlay(root / "overlay.yml", checkpoint_period=2), out)


@pytest.fixture(scope="module")
def reference(work: Run) -> Path:
    """12 steps under maxckpt, saving every 2, keeping the newest 2 plus every 4th: the yardstick run."""
    work.run(
        work.maxckpt_cmd("reference", *args(steps=STEPS, max_num_checkpoints_to_keep=2, maxckpt_keep_period=4)),
        "reference.log",
    )
    return work.checkpoints("reference")


def test_retention_keeps_exactly_the_expected_steps(work: Run, reference: Path) -> None:
    # Saved 0,2,...,10 and the final 11; kept: newest 2 (10, 11) and multiples of 4 (0, 4, 8).
    assert committed_steps(reference) == [0, 4, 8, 10, 11]
    # Beside the steps, only maxckpt's run-directory lock (released: empty) is there.
    assert sorted(p.name for p in reference.iterdir()) == [".maxckpt.lock", "0", "10", "11", "4", "8"]
    summary = (work.out / "reference" / "maxckpt_summary.json").read_text()
    assert '"removed_steps": [\n    2,\n    6\n  ]' in summary
    log = work.log("reference.log")
    assert "maxckpt summary" in log and "removed by retention: [2, 6]" in log


def test_layout_is_plain_maxtexts(work: Run, reference: Path) -> None:
    work.run(work.plain_cmd("plain_layout", *args(steps=1)), "plain_layout.log")
    plain = work.checkpoints("plain_layout") / "0"
    assert (plain / "commit_success.txt").exists()
    assert layout(reference / "0") == layout(plain)
    assert {"_CHECKPOINT_METADATA", "commit_success.txt", "items/_METADATA", "items/manifest.ocdbt"} <= layout(plain)


def test_maxckpt_keys_are_validated_before_maxtext_starts(work: Run) -> None:
    bad = work.run(work.maxckpt_cmd("typo", "maxckpt_keep_perod=4"), "typo.log", check=False)
    assert bad.returncode == 2
    assert "unknown config key 'maxckpt_keep_perod'" in work.log("typo.log")
    assert "did you mean 'maxckpt_keep_period'" in work.log("typo.log")
    assert not (work.out / "typo").exists()

    # The MaxText venv has no torch: an export it cannot write is refused before training, not after.
    no_torch = work.run(work.maxckpt_cmd("no_torch", "maxckpt_export_on_completion=[hf,megatron]"), "no_torch.log", check=False)
    assert no_torch.returncode == 2
    assert "error: maxckpt_export_on_completion: megatron needs torch" in work.log("no_torch.log")
    assert not (work.out / "no_torch").exists()


def test_sigkill_mid_async_save_resumes_to_the_same_weights(work: Run, reference: Path) -> None:
    cmd = work.maxckpt_cmd("killed", *args(steps=STEPS, max_num_checkpoints_to_keep=2, maxckpt_keep_period=4))
    ckpts = work.checkpoints("killed")
    for attempt in range(3):  # a save of a tiny model is short: catch one in flight
        proc = work.start(cmd, f"killed_{attempt}.log")
        try:
            wait_for(lambda: bool(tmp_dirs(ckpts)) and committed_steps(ckpts), 300, "a save after the first", proc, poll=0.002)
            kill(proc)
        finally:
            proc.wait()
        partial = tmp_dirs(ckpts)
        if partial:
            break
    assert partial, "never caught an asynchronous save in flight"
    newest = committed_steps(ckpts)[-1]
    assert newest < FINAL
    work.run(cmd, "killed_resume.log")
    resumed = work.log("killed_resume.log")
    assert f"restoring from this run's directory step {newest}" in resumed
    assert completed_steps(resumed)[0] == newest + 1
    assert "interrupted saves moved aside" in resumed
    assert not tmp_dirs(ckpts)
    assert committed_steps(ckpts) == [0, 4, 8, 10, 11]
    assert_same_arrays(read_all(ckpts / str(FINAL)), read_all(reference / str(FINAL)))


def test_sigterm_checkpoints_the_current_step_and_exits_cleanly(work: Run, reference: Path) -> None:
    cmd = work.maxckpt_cmd("sigterm", *args(steps=STEPS, checkpoint_period=1000))
    proc = work.start(cmd, "sigterm.log")
    try:
        # Steps take milliseconds here: signal as soon as step 1 is logged, well before the last step.
        wait_for(lambda: len(completed_steps(work.log("sigterm.log"))) >= 2, 300, "step 1", proc, poll=0.001)
        kill(proc, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    ckpts = work.checkpoints("sigterm")
    log = work.log("sigterm.log")
    steps = committed_steps(ckpts)
    assert steps[0] == 0 and len(steps) == 2, steps
    stopped = steps[-1]
    assert 1 <= stopped < FINAL, "the signal arrived before the end of the run"
    assert f"SIGTERM: maxckpt saved step {stopped}" in log
    assert f"stopped by SIGTERM after committing step {stopped}" in log
    assert max(completed_steps(log)) <= stopped  # nothing trained after the checkpoint (metrics lag a step)
    assert log.index("SIGTERM received") < log.index(f"SIGTERM: maxckpt saved step {stopped}")

    work.run(cmd, "sigterm_resume.log")
    resumed = work.log("sigterm_resume.log")
    assert f"restoring from this run's directory step {stopped}" in resumed
    assert committed_steps(ckpts) == [0, stopped, FINAL]
    assert_same_arrays(read_all(ckpts / str(FINAL)), read_all(reference / str(FINAL)))


def test_plain_maxtext_resumes_a_maxckpt_run_and_back(work: Run, reference: Path) -> None:
    # maxckpt writes steps 0..5, plain MaxText resumes its run directory to 11.
    work.run(work.maxckpt_cmd("handoff", *args(steps=6)), "handoff_maxckpt.log")
    assert committed_steps(work.checkpoints("handoff")) == [0, 2, 4, 5]
    work.run(work.plain_cmd("handoff", *args(steps=STEPS)), "handoff_plain.log")
    assert "restoring from this run's directory step 5" in work.log("handoff_plain.log")
    assert_same_arrays(read_all(work.checkpoints("handoff") / str(FINAL)), read_all(reference / str(FINAL)))

    # Plain MaxText writes steps 0..5, maxckpt resumes its run directory to 11.
    work.run(work.plain_cmd("backhand", *args(steps=6)), "backhand_plain.log")
    work.run(work.maxckpt_cmd("backhand", *args(steps=STEPS)), "backhand_maxckpt.log")
    assert "restoring from this run's directory step 5" in work.log("backhand_maxckpt.log")
    assert_same_arrays(read_all(work.checkpoints("backhand") / str(FINAL)), read_all(reference / str(FINAL)))


def test_plain_maxtext_loads_a_maxckpt_step_as_full_state(work: Run, reference: Path) -> None:
    work.run(
        work.plain_cmd("from_full_state", *args(steps=STEPS, load_full_state_path=reference / "8" / "items")),
        "full_state.log",
    )
    log = work.log("full_state.log")
    assert f"Loading full state from path: {reference / '8'}" in log
    # The full state carries the step: training continues at 9 and ends as the reference did.
    assert completed_steps(log)[0] == 9
    assert_same_arrays(read_all(work.checkpoints("from_full_state") / str(FINAL)), read_all(reference / str(FINAL)))


def test_export_on_completion_gives_maxtexts_logits_in_transformers(work: Run) -> None:
    import numpy as np
    import torch
    import transformers

    # `python -m maxckpt.maxtext.train` is the same command as `maxckpt maxtext train`.
    cmd = work.maxckpt_cmd(
        "exported", *args(steps=4, dtype="float32", maxckpt_export_on_completion="hf", maxckpt_export_dtype="float32"),
    )
    assert cmd[1:5] == ["-m", "maxckpt", "maxtext", "train"]
    work.run([cmd[0], "-m", "maxckpt.maxtext.train", *cmd[5:]], "exported.log")
    hf_dir = work.out / "exported" / "export" / "hf"
    assert f"exported hf: {hf_dir}" in work.log("exported.log")
    assert (hf_dir / "model.safetensors").is_file() and (hf_dir / "config.json").is_file()

    tokens = np.random.default_rng(0).integers(0, 512, (1, 16)).astype(np.int32)
    np.save(work.out / "tokens.npy", tokens)
    logits_script = Path(__file__).parents[1] / "procs" / "maxtext_logits.py"
    work.run(
        [str(work.python), str(logits_script), str(work.overlay), str(work.checkpoints("exported") / "3" / "items"),
         str(work.out / "tokens.npy"), str(work.out / "maxtext_logits.npy"),
         "run_name=logits", f"base_output_directory={work.out}", "dtype=float32"],
        "maxtext_logits.log",
    )
    maxtext_logits = np.load(work.out / "maxtext_logits.npy")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    assert hf_logits.shape == maxtext_logits.shape == (1, 16, 512)
    np.testing.assert_allclose(hf_logits, maxtext_logits, atol=1e-4, rtol=1e-4)

    # The same step, from an environment with torch, to Megatron and TorchTitan: tensor for tensor.
    from maxckpt.conversion import convert
    from maxckpt.conversion.verify import verify

    step = work.checkpoints("exported") / "3"
    for fmt in ("megatron", "torchtitan"):
        convert(step, work.out / f"exported_{fmt}", to=fmt, model="llama2", dtype="float32")
        report = verify(step, work.out / f"exported_{fmt}", model="llama2")
        assert report.ok and len(report.rows) == 21, (fmt, report.rows)

    # Back from HF with maxckpt's defaults (no zstd, pieces written layer by layer): MaxText's own
    # load_parameters_path restores it and its forward pass gives the same logits.
    back = work.out / "from_hf"
    convert(hf_dir, back, to="maxtext", model="llama2")
    work.run(
        [str(work.python), str(logits_script), str(work.overlay), str(back / "0" / "items"),
         str(work.out / "tokens.npy"), str(work.out / "from_hf_logits.npy"),
         "run_name=logits_back", f"base_output_directory={work.out}", "dtype=float32"],
        "from_hf_logits.log",
    )
    np.testing.assert_allclose(np.load(work.out / "from_hf_logits.npy"), maxtext_logits, atol=1e-5, rtol=1e-5)


def _grain_args(work: Run, data: Path, records: int, length: int) -> list[str]:
    """Write `records` pre-tokenized records of `length` tokens; the grain keys that train on them."""
    work.run([str(work.python), str(Path(__file__).parents[1] / "procs" / "maxtext_grain_data.py"), str(data),
              str(records), str(length), "512"], f"{data.stem}.log")
    found = subprocess.run(
        [str(work.python), "-c", "import importlib.util as u; print(u.find_spec('maxtext').submodule_search_locations[0])"],
        capture_output=True, text=True, check=True, env=run_env(),
    )
    # MaxText 0.2.5's default tokenizer_path points outside its wheel: name the file it ships.
    tokenizer = Path(found.stdout.strip()) / "assets" / "tokenizers" / "tokenizer.llama2"
    return args(
        dataset_type="grain", grain_train_files=data, grain_file_type="arrayrecord", tokenize_train_data=False,
        enable_data_shuffling=False, grain_worker_count=0, tokenizer_path=tokenizer,
    )


def test_grain_iterator_is_saved_and_restored_as_maxtext_does(work: Run, tmp_path: Path) -> None:
    grain = _grain_args(work, tmp_path / "data.array_record", 64, 16)
    work.run(work.maxckpt_cmd("grain_whole", *grain, *args(steps=STEPS)), "grain_whole.log")
    work.run(work.maxckpt_cmd("grain_split", *grain, *args(steps=6)), "grain_first.log")
    first = work.checkpoints("grain_split")
    assert committed_steps(first) == [0, 2, 4, 5]
    assert all((first / str(s) / "iter").is_dir() for s in (0, 2, 4, 5))
    work.run(work.maxckpt_cmd("grain_split", *grain, *args(steps=STEPS)), "grain_second.log")
    assert "restoring from this run's directory step 5" in work.log("grain_second.log")
    # Records are distinct: only an iterator restored at record 6 trains like the uninterrupted run.
    assert_same_arrays(read_all(first / str(FINAL)), read_all(work.checkpoints("grain_whole") / str(FINAL)))


CHECK_SCRIPT = """
import inspect
from maxtext.common import checkpointing
from maxckpt.errors import MaxckptError
from maxckpt.compat.maxtext import check_maxtext

check_maxtext()  # the installed MaxText is the one maxckpt plugs into
print("installed: ok")

def changed(checkpoint_dir, enable_checkpointing, use_async, save_interval_steps, new_arg=None):
    pass

original = checkpointing.create_orbax_checkpoint_manager
checkpointing.create_orbax_checkpoint_manager = changed
try:
    check_maxtext()
except MaxckptError as err:
    print("changed:", err)
checkpointing.create_orbax_checkpoint_manager = original
del checkpointing.maybe_save_checkpoint
try:
    check_maxtext()
except MaxckptError as err:
    print("gone:", err)
"""


def test_a_changed_maxtext_fails_loudly(mt_python: Path) -> None:
    done = subprocess.run([str(mt_python), "-c", CHECK_SCRIPT], capture_output=True, text=True, env=run_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "installed: ok" in done.stdout
    assert "changed: this MaxText is not the one maxckpt plugs into (maxtext==0.2.5): " in done.stdout
    assert "create_orbax_checkpoint_manager(checkpoint_dir, enable_checkpointing, use_async, save_interval_steps, new_arg=None)" in done.stdout
    assert "gone: " in done.stdout and "maxtext.common.checkpointing.maybe_save_checkpoint is gone" in done.stdout


def test_maxtext_train_needs_python_312_and_says_so(monkeypatch) -> None:
    import sys

    from maxckpt.errors import MaxckptError
    from maxckpt.maxtext.train import run

    monkeypatch.setattr(sys, "version_info", (3, 11, 7, "final", 0))
    with pytest.raises(MaxckptError, match=r"MaxText 0.2.5 needs Python >= 3.12 .*pip install 'maxckpt\[maxtext\]'"):
        run("overlay.yml")


def test_demo_maxtext_runs_the_story_on_maxtexts_trainer(mt_python: Path, tmp_path: Path) -> None:
    import json

    demo = tmp_path / "demo"
    done = subprocess.run(
        [str(mt_python), "-m", "maxckpt", "demo", "--maxtext", "--dir", str(demo), "--steps", "30"],
        capture_output=True, text=True, env=run_env(), timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    story = json.loads((demo / "summary.json").read_text())
    assert story["kept_steps"][-1] == 29 and 20 in story["kept_steps"] and 0 in story["kept_steps"]
    assert len([s for s in story["kept_steps"] if s % 20]) <= 3  # newest 3 plus every 20th
    if story["killed_during"]:
        assert story["resumed_from"] == story["expected_resume"]
    assert (Path(story["exports"]["hf"]) / "model.safetensors").is_file()


def test_a_run_maxtext_stops_early_is_not_exported(work: Run, tmp_path: Path) -> None:
    # Records longer than max_target_length: MaxText's data pipeline raises and MaxText stops "gracefully".
    grain = _grain_args(work, tmp_path / "too_long.array_record", 8, 17)
    done = work.run(work.maxckpt_cmd("stopped", *grain, *args(steps=6, maxckpt_export_on_completion="hf")),
                    "stopped.log", check=False)
    log = work.log("stopped.log")
    assert done.returncode == 1, log[-3000:]
    assert "error: MaxText stopped before the run's last step 5 (newest committed step: none)" in log
    assert "the final step was not exported" in log
    assert not (work.out / "stopped" / "export").exists()
    assert '"stopped_early": "MaxText stopped before' in (work.out / "stopped" / "maxckpt_summary.json").read_text()


def test_demo_maxtext_on_python_311_says_what_to_install(tmp_path: Path, monkeypatch, capsys) -> None:
    import sys

    from maxckpt.cli.main import main

    monkeypatch.setattr(sys, "version_info", (3, 11, 7, "final", 0))
    with pytest.raises(SystemExit) as done:
        main(["demo", "--maxtext", "--dir", str(tmp_path / "d")])
    assert done.value.code == 1
    assert "error: MaxText 0.2.5 needs Python >= 3.12" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


# A gpt-oss run trained with settings no preset has: top-2 of 4 experts, a window of 4, rope theta 20000.
GPT_OSS_RUN = dict(
    model_name="gpt-oss-20b", override_model_config=True, base_emb_dim=64, base_num_query_heads=4,
    base_num_kv_heads=2, head_dim=16, base_num_decoder_layers=2, num_experts=4, num_experts_per_tok=2,
    base_moe_mlp_dim=32, vocab_size=512, sliding_window_size=4, rope_max_timescale=20000, dtype="float32",
    steps=2, checkpoint_period=1, learning_rate=0.003,
)


def _maxtext_logits(work: Run, run_name: str, step: int, run_args: list[str], tokens, tmp_path: Path):
    """MaxText's own forward pass on the run's checkpoint `step`, with the run's own settings."""
    import numpy as np

    np.save(tmp_path / "tokens.npy", tokens)
    work.run(
        [str(work.python), str(Path(__file__).parents[1] / "procs" / "maxtext_logits.py"), str(work.overlay),
         str(work.checkpoints(run_name) / str(step) / "items"), str(tmp_path / "tokens.npy"),
         str(tmp_path / "maxtext.npy"), f"run_name={run_name}_logits", f"base_output_directory={work.out}",
         *[a for a in run_args if not a.startswith(("steps=", "checkpoint_period=", "learning_rate="))]],
        f"{run_name}_logits.log",
    )
    return np.load(tmp_path / "maxtext.npy")


def _hf_logits(path: Path, tokens):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


# DeepSeek-V3 routing with groups (MaxText's deepseek3-671b config asks for 8 / 4): 8 experts in 4 groups, the
# best 2 groups' experts eligible; and its own YaRN factor and rope theta.
DEEPSEEK_RUN = dict(
    model_name="deepseek3-671b", override_model_config=True, base_emb_dim=64, base_num_query_heads=2,
    base_num_kv_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=16,
    base_num_decoder_layers=4, first_num_dense_layers=1, base_mlp_dim=64, num_experts=8, num_experts_per_tok=2,
    shared_experts=1, base_moe_mlp_dim=32, n_routing_groups=4, topk_routing_group=2, rope_factor=20,
    rope_max_timescale=5000, vocab_size=256, dtype="float32", steps=2, checkpoint_period=1, learning_rate=0.003,
)


def test_a_deepseek_run_with_group_limited_routing_converts_true_to_the_run(work: Run, tmp_path: Path) -> None:
    """Routing groups, top-k and YaRN settings of the run reach config.json from its record or its config;
    transformers then gives MaxText's logits (routing bias included). The preset (no groups, YaRN factor 40) is
    named as assumed and computes other logits."""
    import shutil

    import numpy as np

    from maxckpt.conversion import SourceOptions, convert

    run_args = args(**DEEPSEEK_RUN)
    work.run(work.maxckpt_cmd("deepseek_own", *run_args), "deepseek_own.log")
    tokens = np.random.default_rng(2).integers(0, 256, (1, 16)).astype(np.int32)
    expected = _maxtext_logits(work, "deepseek_own", 1, run_args, tokens, tmp_path)

    recorded = convert(work.out / "deepseek_own", tmp_path / "recorded", to="hf")  # no --model, no --set
    spec = recorded.spec
    assert (spec.n_group, spec.topk_group, spec.num_experts_per_tok, spec.rope_theta) == (4, 2, 2, 5000)
    assert spec.rope_scaling["factor"] == 20
    assert not [n for n in recorded.notes if n.startswith("assumed from")], recorded.notes
    np.testing.assert_allclose(_hf_logits(tmp_path / "recorded", tokens), expected, atol=1e-4, rtol=0)

    bare = tmp_path / "bare_run"
    shutil.copytree(work.out / "deepseek_own" / "checkpoints", bare / "checkpoints")
    sets = {k: v for k, v in DEEPSEEK_RUN.items() if k not in ("steps", "checkpoint_period", "dtype", "learning_rate")}
    convert(bare, tmp_path / "configured", to="hf", source=SourceOptions(maxtext_config=work.overlay, overrides=sets))
    np.testing.assert_allclose(_hf_logits(tmp_path / "configured", tokens), expected, atol=1e-4, rtol=0)

    guessed = convert(bare, tmp_path / "guessed", to="hf", model="deepseek3-671b", source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    [note] = [n for n in guessed.notes if n.startswith("assumed from the deepseek3-671b preset")]
    assert "n_group=1" in note and "topk_group=1" in note and "factor': 40.0" in note, note  # MaxText's defaults
    assert np.abs(_hf_logits(tmp_path / "guessed", tokens) - expected).max() > 1e-3


def test_a_run_trained_with_its_own_settings_converts_true_to_the_run(work: Run, tmp_path: Path) -> None:
    """The run's record (written by `maxckpt maxtext train`) or its config (--maxtext-config plus the run's
    command line as --set) gives an HF model with MaxText's logits; the preset alone names what it assumes."""
    import shutil

    import numpy as np
    import torch
    import transformers

    from maxckpt.config.maxtext_run import RECORD_FILE
    from maxckpt.conversion import SourceOptions, convert

    run_args = args(**GPT_OSS_RUN)
    work.run(work.maxckpt_cmd("gpt_oss_own", *run_args), "gpt_oss_own.log")
    run_dir = work.out / "gpt_oss_own"
    assert (run_dir / RECORD_FILE).is_file()
    tokens = np.random.default_rng(1).integers(0, 512, (1, 16)).astype(np.int32)
    np.save(tmp_path / "tokens.npy", tokens)
    work.run(
        [str(work.python), str(Path(__file__).parents[1] / "procs" / "maxtext_logits.py"), str(work.overlay),
         str(work.checkpoints("gpt_oss_own") / "1" / "items"), str(tmp_path / "tokens.npy"),
         str(tmp_path / "maxtext.npy"), "run_name=gpt_oss_logits", f"base_output_directory={work.out}",
         *[a for a in run_args if not a.startswith(("steps=", "checkpoint_period="))]],
        "gpt_oss_logits.log",
    )
    expected = np.load(tmp_path / "maxtext.npy")

    def hf_logits(path: Path) -> np.ndarray:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()

    recorded = convert(run_dir, tmp_path / "recorded", to="hf")  # no --model, no --set
    assert (recorded.spec.sliding_window, recorded.spec.num_experts_per_tok, recorded.spec.rope_theta) == (4, 2, 20000)
    np.testing.assert_allclose(hf_logits(tmp_path / "recorded"), expected, atol=1e-4, rtol=0)

    bare = tmp_path / "bare_run"  # the same checkpoints without the record: the run's config says it all
    shutil.copytree(run_dir / "checkpoints", bare / "checkpoints")
    sets = {k: v for k, v in GPT_OSS_RUN.items() if k not in ("steps", "checkpoint_period", "dtype", "learning_rate")}
    convert(bare, tmp_path / "configured", to="hf", source=SourceOptions(maxtext_config=work.overlay, overrides=sets))
    np.testing.assert_allclose(hf_logits(tmp_path / "configured"), expected, atol=1e-4, rtol=0)

    guessed = convert(bare, tmp_path / "guessed", to="hf", model="gpt-oss-20b", source=SourceOptions(overrides={"num_experts_per_tok": 2}))
    [note] = [n for n in guessed.notes if n.startswith("assumed from the gpt-oss-20b preset")]
    assert "sliding_window=128" in note and "rope_theta=150000" in note
    assert np.abs(hf_logits(tmp_path / "guessed") - expected).max() > 1e-3  # the preset computes other logits
