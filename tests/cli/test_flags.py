"""The `ninfer-serve` command-line contract: flags, profiles, environment, exit codes."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.cli.capabilities import FeatureUnavailable, Machine, check_features
from ninfer_engine.cli.flag_table import PROFILES
from ninfer_engine.cli.flag_values import UsageError
from ninfer_engine.cli.flags import expand_profile, parse_args

CPU = Machine(cuda_devices=0)
TWO_GPUS = Machine(cuda_devices=2)


def parse(*argv: str, env: dict[str, str] | None = None):
    return parse_args(list(argv), env or {})


def test_defaults_follow_the_manual_page():
    c = parse("m.ninfer").config
    assert (c.host, c.port, c.max_context, c.max_concurrency) == ("127.0.0.1", 8080, 8192, 1)
    # --default-max-tokens unset: the engine takes the artifact's max_new_tokens, else 8192
    assert (c.kv_dtype, c.kv_lease_window, c.prefill_chunk, c.default_max_tokens) == (
        "bf16", 4096, None, None)
    assert c.kv_tokens == 8192 and c.spec is None and not c.vision


@pytest.mark.parametrize("gib, cuda_chunk", [(80, 8192), (141, 8192), (48, 4096), (16, 4096)])
def test_prefill_chunk_auto_depends_on_the_device(monkeypatch, gib, cuda_chunk):
    from ninfer_engine.serving import prefill_chunk_for

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=gib * 2**30 - 2**28))
    auto = parse("m.ninfer", "--prefill-chunk", "auto").config
    assert auto.prefill_chunk is None
    # (an "80 GB" H100 reports 79.1 GiB; the threshold is 70)
    assert prefill_chunk_for(auto, torch.device("cuda", 0)) == cuda_chunk
    assert prefill_chunk_for(auto, torch.device("cpu")) == 1024
    fixed = parse("m.ninfer", "--prefill-chunk", "256").config
    assert prefill_chunk_for(fixed, torch.device("cuda", 0)) == 256


@pytest.mark.parametrize("capability, auto", [((9, 0), "auto"), ((8, 9), "auto"),
                                               ((8, 6), "dequant"), ((8, 0), "dequant")])
def test_cuda_weights_auto_decodes_to_bf16_below_sm89(monkeypatch, capability, auto):
    """`--cuda-weights auto` serves e4m3 forms (fp8-row, Q4/Q5 as fp8 groups, fp8 expert
    stacks), which Triton compiles nothing for below sm89: there it decodes to bf16 at load;
    an explicit `packed` or `dequant` is kept, and off CUDA or in fp32 it is always dequant."""
    from ninfer_engine.serving import weights_mode

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda", 0)
    for flag, want in (("auto", auto), ("packed", "packed"), ("dequant", "dequant")):
        config = parse("m.ninfer", "--cuda-weights", flag).config
        assert weights_mode(config, cuda, torch.bfloat16) == want
        assert weights_mode(config, cuda, torch.float32) == "dequant"
        assert weights_mode(config, torch.device("cpu"), torch.bfloat16) == "dequant"


@pytest.mark.parametrize("formats, moe, found", [
    ({"fp8_e4m3fn_row_bf16", "bf16"}, False, "fp8_e4m3fn_row_bf16"),
    ({"nvfp4", "fp8_e4m3fn_row_bf16"}, False, "fp8_e4m3fn_row_bf16"),
    ({"nvfp4", "q4_g64_fp16"}, False, None),  # nvfp4's scales decoded from their bits
    ({"q4_g64_fp16", "q6_g64_fp16"}, True, "q4_g64_fp16"),  # experts as fp8 groups
    ({"q4_g64_fp16", "q6_g64_fp16"}, False, None),  # dense: int-code GEMVs
    ({"bf16"}, True, None)])
def test_cuda_weights_packed_below_sm89_names_the_e4m3_formats(monkeypatch, formats, moe, found):
    """An explicit `--cuda-weights packed` keeps e4m3 codes as stored (fp8-row, a MoE model's
    Q4/Q5 experts as fp8 groups), which Triton compiles nothing for below sm89: the load stops
    with one line naming them and the device, not a compile error at the first request; stores
    without them (nvfp4, whose scales the kernels decode from their bits) stay packed there."""

    from ninfer_engine import serving

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    objects = {f"o{i}": SimpleNamespace(format=f, kind="tensor") for i, f in enumerate(formats)}
    objects["tokenizer"] = SimpleNamespace(format="json", kind="resource")
    artifact = SimpleNamespace(objects=objects, config=lambda component: (
        {"num_experts": 8} if moe else {}))
    config = parse("m.ninfer", "--cuda-weights", "packed").config
    cuda = torch.device("cuda", 0)
    if found is None:
        assert serving.weights_mode(config, cuda, torch.bfloat16, artifact) == "packed"
        return
    with pytest.raises(ValueError, match=rf"^--cuda-weights packed keeps this artifact's "
                       rf"{found} codes as stored, which need an sm89\+ GPU \(e4m3\); cuda:0 "
                       r"is sm86: --cuda-weights auto or dequant decode them to bf16$"):
        serving.weights_mode(config, cuda, torch.bfloat16, artifact)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert serving.weights_mode(config, cuda, torch.bfloat16, artifact) == "packed"


def test_e4m3_kv_needs_sm89_on_the_serving_devices():
    """`--kv-dtype fp8` keeps e4m3 codes the attention kernels convert in hardware: a serving
    device below sm89 stops startup with one line naming the flag, the device and what runs
    there; the CPU (no CUDA device) and sm89+ devices run it, other KV dtypes anywhere (nvfp4's
    block scales are decoded from their bits)."""
    ampere = Machine(cuda_devices=2, capability=((8, 6), (9, 0)))
    for kv in ("fp8",):
        parsed = parse("m", "--kv-dtype", kv)
        with pytest.raises(FeatureUnavailable, match=rf"`--kv-dtype {kv}`: {kv} KV holds e4m3 "
                           r"codes, which need an sm89\+ GPU; CUDA device 0 is sm86 \(int8"):
            check_features(parsed.config, parsed.explicit, ampere)
        check_features(parsed.config, parsed.explicit, CPU)
        on_hopper = parse("m", "--kv-dtype", kv, "--device", "1")
        check_features(on_hopper.config, on_hopper.explicit, ampere)
        both = parse("m", "--kv-dtype", kv, "--tp", "2", "--devices", "1,0")
        with pytest.raises(FeatureUnavailable, match="CUDA device 0 is sm86"):
            check_features(both.config, both.explicit, ampere)
    for kv in ("int8", "k8v4", "nvfp4", "bf16"):
        parsed = parse("m", "--kv-dtype", kv)
        check_features(parsed.config, parsed.explicit, ampere)


def test_no_artifact_serves_the_default_model(tmp_path):
    c = parse("--port", "9000", env={"NINFER_HOME": str(tmp_path)}).config
    assert c.artifact == tmp_path / "models" / "smollm2-135m-instruct.ninfer"
    assert c.port == 9000


@pytest.mark.parametrize("argv, reason", [
    (["m", "--bogus"], "unknown flag --bogus"),
    (["m", "--port"], "--port: expected a value"),
    (["m", "--port", "x"], "--port: expected an integer"),
    (["m", "--port", "0"], "--port: 0 is out of range 1..65535"),
    (["m", "--port", "65536"], "out of range"),
    (["m", "--max-concurrency", "9"], "--max-concurrency: 9 is out of range 1..8"),
    (["m", "--max-concurrency", "0"], "--max-concurrency: 0 is out of range 1..8"),
    (["m", "--kv-dtype", "fp16"], "--kv-dtype: 'fp16' is not one of"),
    (["m", "--tp", "3"], "--tp: 3 is out of range 1..2"),
    (["m", "--tp", "2"], "--tp 2 requires --devices A,B"),
    (["m", "--tp", "2", "--devices", "0,0"], "the two devices must differ"),
    (["m", "--tp", "2", "--devices", "0"], "expected two device indices"),
    (["m", "--temperature", "2.5"], "--temperature: 2.5 is out of range"),
    (["m", "--top-p", "0"], "--top-p: 0 is out of range (0.0, 1.0]"),
    (["m", "--top-k", "21"], "--top-k: 21 is out of range 0..20"),
    (["m", "--min-p", "1.5"], "--min-p"),
    (["m", "--presence-penalty", "-3"], "--presence-penalty"),
    (["m", "--seed", "1.5"], "--seed: expected an integer"),
    (["m", "--kv-grow", "4096"], "--kv-grow requires --elastic"),
    (["m", "--kv-budget-gib", "2"], "--kv-budget-gib requires --elastic"),
    (["m", "--elastic", "--kv-budget-gib", "0"], "--kv-budget-gib: 0 is out of range"),
    (["m", "--draft-tokens", "3"], "--draft-tokens requires --spec"),
    (["m", "--lm-head-draft"], "--lm-head-draft requires --spec"),
    (["m", "--spec", "mtp", "--draft-tokens", "6"], "out of range 1..5 for --spec mtp"),
    (["m", "--spec", "dflash", "--draft-tokens", "16"], "--draft-tokens: 16 is out of range"),
    (["m", "--spec", "eagle"], "--spec: 'eagle' is not one of"),
    (["m", "--max-vision-tokens", "10"], "--max-vision-tokens: 10 is out of range 64..16384"),
    (["m", "--prefill-chunk", "1000"], "--prefill-chunk: 1000 is not a multiple of 128"),
    (["m", "--kv-capacity", "100", "--max-context", "200"], "smaller than --max-context"),
    (["m", "--kv-capacity", "lots"], "--kv-capacity: expected an integer"),
    (["m", "--vram-headroom-mib", "512"], "--vram-headroom-mib requires --kv-capacity auto"),
    (["m", "--no-prefix-reuse", "--device-state-slots", "2"],
     "conflicts with --device-state-slots"),
    (["m", "--log-level", "loud"], "--log-level: 'loud' is not one of"),
    (["m", "--api-key", " "], "--api-key: must not be empty"),
    (["m", "--cpu-matmul", "int4"], "--cpu-matmul: 'int4' is not one of fp32, bf16, int8"),
    (["m", "--cpu-step", "jit"], "--cpu-step: 'jit' is not one of compiled, eager"),
    (["m", "--cuda-dtype", "fp16"], "--cuda-dtype: 'fp16' is not one of bf16, fp32"),
    (["m", "--prefill-activations", "int8"], "--prefill-activations: 'int8' is not one of fp8"),
    (["m", "--profile", "70b"], "--profile: '70b' is not one of"),
    (["m", "--profile"], "--profile: expected a value"),
    (["m", "--cors=yes"], "--cors takes no value"),
    (["m", "--help"], "--help is only accepted as the first argument"),
    (["m", "-h"], "-h is only accepted as the first argument"),
    (["m", "extra"], "unexpected argument 'extra'"),
    (["m", "--request-log-jsonl", "/nonexistent/dir/log.jsonl"], "does not exist"),
    (["m", "--chat-template", "/nonexistent.jinja"], "is not a readable file"),
])
def test_bad_flags_give_one_line_reasons(argv, reason):
    with pytest.raises(UsageError) as err:
        parse(*argv)
    assert reason in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["fp32", "bf16", "int8"])
def test_cpu_matmul_values_reach_the_frozen_config(value):
    import dataclasses

    c = parse("m", "--cpu-matmul", value).config
    assert c.cpu_matmul == value
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.cpu_matmul = "fp32"
    assert parse("m").config.cpu_matmul == "fp32"


def test_cpu_activations_default_to_fp32_and_reach_the_config():
    """fp32 GEMV inputs stay the default: int16 answered alike but ran 0.99x llama.cpp against
    fp32's 1.26x side by side on the 2-core box (the step is bound by memory there)."""
    assert parse("m").config.cpu_activations == "fp32"
    assert parse("m", "--cpu-activations", "int16").config.cpu_activations == "int16"


def test_cpu_step_defaults_to_the_compiled_step():
    assert parse("m").config.cpu_step == "compiled"
    assert parse("m", "--cpu-step", "eager").config.cpu_step == "eager"


def test_flag_equals_form_and_later_flags_win():
    c = parse("m", "--port=9001", "--port", "9002", "--temperature=0.5").config
    assert c.port == 9002 and c.temperature == 0.5


@pytest.mark.parametrize("env, reason", [
    ({"NINFER_CUDA_SYNC": "busy"}, "NINFER_CUDA_SYNC='busy' is not one of spin, blocking"),
    ({"NINFER_RAM_GUARD": "no"}, "NINFER_RAM_GUARD"),
    ({"NINFER_HOST_TIER_RAM_GUARD": "2"}, "NINFER_HOST_TIER_RAM_GUARD"),
])
def test_environment_is_validated(env, reason):
    with pytest.raises(UsageError, match=reason):
        parse("m", env=env)


@pytest.mark.parametrize("policy", ["spin", "blocking", "yield", "auto"])
def test_cuda_sync_policies(policy):
    assert parse("m", env={"NINFER_CUDA_SYNC": policy}).config.cuda_sync == policy


def test_profile_expands_right_after_the_artifact():
    assert expand_profile(["m", "--port", "1", "--profile", "27b"]) == [
        "m", "--profile", "27b", *PROFILES["27b"], "--port", "1"]
    c = parse("m", "--profile", "flash-next").config
    assert (c.tp, c.devices, c.kv_dtype, c.elastic, c.max_context, c.spec, c.draft_tokens) == (
        2, (0, 1), "int8", True, 262144, "mtp", 3)


def test_later_flags_override_the_profile_wherever_profile_appears():
    c = parse("m", "--max-context", "4096", "--profile", "27b", "--kv-dtype", "fp8").config
    # flags after the artifact path come after the expansion, so both user flags win
    assert c.max_context == 4096 and c.kv_dtype == "fp8"
    assert c.host_state_slots == 8 and c.host_kv_mib == 8192 and c.device_state_slots == 4


def test_no_vision_clears_the_profile_vision_flags():
    parsed = parse("m", "--profile", "27b", "--no-vision")
    c = parsed.config
    assert not c.vision and c.max_vision_tokens == 16384 and c.vision_device == 0
    assert not {"--vision", "--max-vision-tokens", "--vision-device"} & parsed.explicit
    assert parse("m", "--profile", "27b").config.max_vision_tokens == 4096


def test_help_only_as_first_argument():
    assert parse("--help").help and parse("-h").help


@pytest.mark.parametrize("argv, message", [
    (["m", "--context-cost-presets", __file__],
     f"`--context-cost-presets {__file__}`: context cost presets is not available yet"),
    (["m", "--spec", "dflash2", "--tp", "2", "--devices", "0,1", "--lm-head-draft"],
     "tensor parallelism needs CUDA devices 0,1"),
    (["m", "--log-speculation-detail"],
     "`--log-speculation-detail`: per-round speculation detail needs --spec"),
    (["m", "--vision", "--vision-device", "1"], "`--vision-device 1`: CUDA device 1 does not "
     "exist (this machine has 0)"),
    (["m", "--tp", "2", "--devices", "0,1"], "tensor parallelism needs CUDA devices 0,1"),
    (["m", "--profile", "flash-next"], "`--profile flash-next` (`--tp 2`): tensor parallelism "
     "needs CUDA devices 0,1; this machine has 0"),
    (["m", "--kv-capacity", "auto"], "automatic KV sizing needs a CUDA device"),
    (["m", "--device", "1"], "CUDA device 1 does not exist"),
])
def test_missing_features_are_named_never_ignored(argv, message):
    parsed = parse(*argv)
    with pytest.raises(FeatureUnavailable) as err:
        check_features(parsed.config, parsed.explicit, CPU)
    assert str(err.value) == message or message in str(err.value)


# the manual's profile sentences, verbatim (ninfer-serve-manpage.txt, DESCRIPTION)
MANPAGE_PROFILES = {
    "flash-next": "--tp 2 --devices 0,1 --kv-dtype int8 --elastic --max-context 262144 "
                  "--max-concurrency 1 --spec mtp --draft-tokens 3",
    "27b": "--tp 2 --devices 0,1 --kv-dtype int8 --max-context 196608 --device-state-slots 4 "
           "--max-concurrency 1 --spec mtp --draft-tokens 3 --vision --vision-device 0 "
           "--max-vision-tokens 4096 --host-state-slots 8 --host-kv-mib 8192",
}


@pytest.mark.parametrize("profile", sorted(MANPAGE_PROFILES))
def test_each_profile_expands_to_the_manuals_flag_set(profile):
    assert expand_profile(["m", "--profile", profile]) == [
        "m", "--profile", profile, *MANPAGE_PROFILES[profile].split()]


@pytest.mark.parametrize("profile", sorted(MANPAGE_PROFILES))
def test_both_profiles_pass_the_feature_check_where_two_gpus_exist(profile):
    parsed = parse("m", "--profile", profile)
    check_features(parsed.config, parsed.explicit, TWO_GPUS)
    assert (parsed.config.tp, parsed.config.spec, parsed.config.vision) == (
        2, "mtp", profile == "27b")


@pytest.mark.parametrize("profile", sorted(MANPAGE_PROFILES))
@pytest.mark.parametrize("gpus", [0, 1])
def test_a_profile_without_its_two_gpus_is_refused_in_one_line(profile, gpus):
    parsed = parse("m", "--profile", profile)
    with pytest.raises(FeatureUnavailable) as err:
        check_features(parsed.config, parsed.explicit, Machine(cuda_devices=gpus))
    assert str(err.value) == (f"`--profile {profile}` (`--tp 2`): tensor parallelism needs "
                              f"CUDA devices 0,1; this machine has {gpus}")


@pytest.mark.parametrize("profile", sorted(MANPAGE_PROFILES))
def test_the_consoles_profile_switch_checks_the_machine_the_same_way(profile):
    from ninfer_engine.supervisor import Supervisor

    assert Supervisor(["m"], machine=TWO_GPUS).check_profile(profile) is None
    assert Supervisor(["m", "--port", "1"], machine=Machine(cuda_devices=1)).check_profile(
        profile) == (f"`--profile {profile}` (`--tp 2`): tensor parallelism needs CUDA devices "
                     "0,1; this machine has 1")


def test_tensor_parallelism_runs_where_its_devices_exist():
    parsed = parse("m", "--tp", "2", "--devices", "0,1", "--tp-experts", "intermediate")
    check_features(parsed.config, parsed.explicit, TWO_GPUS)
    assert parsed.config.tp_experts == "intermediate"
    with pytest.raises(FeatureUnavailable, match="needs CUDA devices 1,2; this machine has 2"):
        parsed = parse("m", "--tp", "2", "--devices", "1,2")
        check_features(parsed.config, parsed.explicit, TWO_GPUS)


def test_cpu_ranks_only_when_asked_and_only_without_cuda(monkeypatch):
    """`NINFER_TP_CPU=1` (ours, tests and drills): `--tp 2` as gloo processes on the CPU."""
    parsed = parse("m", "--tp", "2", "--devices", "0,1")
    monkeypatch.setenv("NINFER_TP_CPU", "1")
    check_features(parsed.config, parsed.explicit, CPU)
    with pytest.raises(FeatureUnavailable, match="needs CUDA devices 0,1; this machine has 1"):
        check_features(parsed.config, parsed.explicit, Machine(cuda_devices=1))
    monkeypatch.setenv("NINFER_TP_CPU", "0")
    with pytest.raises(FeatureUnavailable, match="this machine has 0"):
        check_features(parsed.config, parsed.explicit, CPU)


def test_mtp_drafts_run_on_cpu_and_gpu_machines():
    parsed = parse("m", "--spec", "mtp", "--draft-tokens", "2")
    check_features(parsed.config, parsed.explicit, CPU)
    check_features(parsed.config, parsed.explicit, TWO_GPUS)


def test_plain_flags_pass_the_feature_check():
    parsed = parse("m", "--max-concurrency", "4", "--greedy", "--cors", "--api-key", "k",
                   "--default-thinking-budget", "2048")
    check_features(parsed.config, parsed.explicit, CPU)


def test_vision_runs_on_the_cpu_and_on_its_cuda_device():
    parsed = parse("m", "--vision", "--vision-device", "0", "--max-vision-tokens", "4096",
                   "--media-cache-mib", "64")
    check_features(parsed.config, parsed.explicit, CPU)
    parsed = parse("m", "--vision", "--vision-device", "1")
    check_features(parsed.config, parsed.explicit, TWO_GPUS)


def test_elastic_kv_runs_on_the_cpu():
    parsed = parse("m", "--elastic", "--kv-grow", "4096", "--kv-budget-gib", "0.5")
    check_features(parsed.config, parsed.explicit, CPU)


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8", "fp8", "nvfp4", "k8v4"])
def test_kv_dtypes_and_device_state_slots_run_on_the_cpu(kv_dtype):
    parsed = parse("m", "--kv-dtype", kv_dtype, "--device-state-slots", "3")
    check_features(parsed.config, parsed.explicit, CPU)


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ninfer_tui.cli", *argv], capture_output=True,
                          text=True, timeout=60, env=full_env, stdin=subprocess.DEVNULL)


def test_cli_bad_flag_prints_reason_and_usage_and_exits_1():
    out = run_cli("m.ninfer", "--max-concurrency", "12")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[0] == "ninfer-serve: error: --max-concurrency: 12 is out of range 1..8"
    assert lines[1].startswith("usage: ninfer-serve")


def test_cli_missing_feature_exits_1_naming_it(tmp_path):
    presets = tmp_path / "presets.json"
    presets.write_text("{}")
    out = run_cli(str(tmp_path / "m.ninfer"), "--context-cost-presets", str(presets))
    assert out.returncode == 1
    assert "context cost presets is not available yet" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.skipif(torch.cuda.device_count() >= 2,
                    reason="this machine has the profile's two GPUs")
@pytest.mark.parametrize("profile", sorted(MANPAGE_PROFILES))
def test_cli_profile_without_two_gpus_exits_1_in_one_line(tmp_path, profile):
    out = run_cli(str(tmp_path / "m.ninfer"), "--profile", profile, "--no-tui")
    assert out.returncode == 1
    gpus = torch.cuda.device_count()
    assert out.stderr.splitlines() == [
        f"ninfer-serve: error: `--profile {profile}` (`--tp 2`): tensor parallelism needs CUDA "
        f"devices 0,1; this machine has {gpus}"]


def test_cli_missing_artifact_exits_1(tmp_path):
    out = run_cli("--no-tui", env={"NINFER_HOME": str(tmp_path)})
    assert out.returncode == 1
    assert "artifact not found" in out.stderr and "install.sh" in out.stderr


def test_cli_help_exits_0():
    out = run_cli("--help")
    assert out.returncode == 0
    assert out.stdout.startswith("usage: ninfer-serve") and "--profile flash-next" in out.stdout


def test_prefill_activations_default_to_fp8_and_reach_the_models_moe(monkeypatch):
    """`--prefill-activations` reaches the config, the loader puts it in the text config the
    model is built from, and `SparseMoE` reads it there (absent: fp8)."""

    import torch

    from ninfer_engine import rank_parts
    from ninfer_engine.models.packed import FP8_ACTIVATIONS_KEY
    from tests.models.test_moe_dispatch import make

    assert parse("m").config.prefill_activations == "fp8"
    assert parse("m", "--prefill-activations", "bf16").config.prefill_activations == "bf16"
    built = []

    class Built(Exception):
        pass

    def build(text_config, *args):
        built.append(text_config)
        raise Built

    monkeypatch.setattr(rank_parts, "build_model", build)
    artifact = SimpleNamespace(config=lambda component: {"num_experts": 4})
    for value in ("fp8", "bf16"):
        config = parse("m", "--prefill-activations", value).config
        with pytest.raises(Built):
            rank_parts.load_rank(config, artifact, torch.device("cpu"), torch.float32, None,
                                 "dequant", 1024)
    assert [c[FP8_ACTIVATIONS_KEY] for c in built] == [True, False]
    assert built[0]["num_experts"] == 4 and artifact.config("text") == {"num_experts": 4}
    assert make(4, 2, True, torch.float32).fp8_activations
